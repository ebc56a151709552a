"""The ``sync`` variant: conventional synchronous function calling in chat turns, without CML
(the Sync column of the paper's Table 1).

The system prompt is the inferlet's with ``PLAIN_RULES``. Each assistant turn holds the calls
that are ready, one per line, and ends; the next turn (role ``tool``) brings their results, one
line per call as ``call = result``; when no call is left the assistant tells the user the results.
Every turn is rendered by the chat template; loss falls on the assistant's text and the token
that closes its turn.
"""

from __future__ import annotations

from . import protocol
from .segments import Encoder, Segment
from .simulate import Timing, Transcript
from .tasks import Task, function_name, parse_value


def results_text(pairs: list[tuple[str, str]]) -> str:
    """The ``tool`` turn after a round of calls."""
    return "\n".join(f"{call} = {value}" for call, value in pairs)


def plain_sync(task: Task, encoder: Encoder, timing: Timing) -> Transcript:
    if task.follow_up is not None:
        raise ValueError(f"{task.task_id}: the sync variant takes no follow-up")
    registry = task.registry(timing.estimate_ms_by_name)
    system = protocol.prompt().system_prompt(registry.describe(), rules=protocol.prompt().PLAIN_RULES)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task.question}]
    segments = [Segment("prompt", encoder.encode(encoder.chat(messages)))]
    results: list[list] = [[] for _ in task.subtasks]
    calls: list[str] = []
    now_ms = 0.0
    while True:
        ready = [i for i, s in enumerate(task.subtasks) if len(results[i]) < len(s.steps)]
        if ready:
            round_calls = [task.subtasks[i].call(len(results[i]), results[i]) for i in ready]
            content = "\n".join(round_calls)
        else:
            content = "\n".join(s.sentence(r) for s, r in zip(task.subtasks, results))
        now_ms += _assistant_turn(encoder, messages, content, segments) * timing.tpot_ms
        if not ready:
            break
        values = [registry.execute(call) for call in round_calls]
        for i, value in zip(ready, values):
            results[i].append(parse_value(value))
        calls += round_calls
        now_ms += max(timing.estimate_ms_by_name[function_name(c)] for c in round_calls)
        turn_start = encoder.chat(messages, add_generation_prompt=False)
        messages.append({"role": "tool", "content": results_text(list(zip(round_calls, values)))})
        rendered = encoder.chat(messages)
        segments.append(Segment("turn", encoder.encode(rendered[len(turn_start):])))
    facts = [f for s, r in zip(task.subtasks, results) for f in s.facts(r)]
    return Transcript(segments, calls, facts, now_ms, encoder.system_length(system, segments[0].token_ids))


def _assistant_turn(encoder: Encoder, messages: list[dict], content: str, segments: list[Segment]) -> int:
    """Append the assistant's ``content`` and the token closing its turn; the number of tokens it wrote.

    The rest of the template's closing text (the newline after ``<|im_end|>``) is not the
    model's: it goes in a ``turn`` segment."""
    before = encoder.chat(messages)
    messages.append({"role": "assistant", "content": content})
    after = encoder.chat(messages, add_generation_prompt=False)
    if not after.startswith(before + content):
        raise ValueError("the chat template does not render an assistant turn after its generation prompt")
    written = encoder.encode(content) + [encoder.end_of_turn_id]
    segments.append(Segment("model", written))
    closing = encoder.encode(after[len(before) + len(content):])
    if closing[:1] != [encoder.end_of_turn_id]:
        raise ValueError("the chat template does not close an assistant turn with its end-of-turn token")
    if closing[1:]:
        segments.append(Segment("turn", closing[1:]))
    return len(written)

