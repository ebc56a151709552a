"""codeact: the model acts by writing code; a restricted evaluator inside the inferlet runs it.

CodeAct (Wang et al. 2024) with Python as the action language. The chat holds instructions, one worked
example and the task. Each turn the model writes a reply (greedy, T tokens at most). A reply with a
```python block is an action: the block runs in ``sandbox.py`` (numbers, lists, arithmetic, names bound
in the snippet, a few pure functions; no imports, attributes, builtins or host calls; sizes capped), the
reply is cut after the block's closing fence (what the model wrote past it, a guessed observation
say, is dropped from the context), and the result comes back as the next user turn, "Observation:
VALUE" (the value's repr, "error: ..." or "refused: ..."). A reply without a block ends the loop: its
text after "Answer:" (or all of it) is the answer; a block left open (the budget spent) is observed
as refused. At most N turns.

Sends one JSON message: {"answer": text or null, "turns": [{"start": where the turn's generation began
in the context, "tokens": what the model generated, "reply": the text kept, "code": the block or null,
"observation": text or null}], "context": the context's token ids at the end}.
"""

import json
import re

import inferlet
import sandbox
from inferlet.arguments import text, whole

SYSTEM = ("You solve the task by writing Python code. Reply with one ```python block whose last line is an "
          "expression: its value comes back to you as an Observation. When you know the answer, reply with: "
          "Answer: the value.")
EXAMPLE = [{"role": "user", "content": "Task: What is 12 times 7, plus 5?"},
           {"role": "assistant", "content": "```python\nx = 12 * 7\nx + 5\n```"},
           {"role": "user", "content": "Observation: 89"},
           {"role": "assistant", "content": "Answer: 89"}]
BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
MARK = "\x1fREPLY\x1f"  # stands for a reply in a rendered chat, to find the text that follows one

ARGS = inferlet.ArgumentParser("codeact", __doc__)
ARGS.add_argument("task", metavar="TASK", type=text, help="what the model is to solve")
ARGS.add_argument("--turns", metavar="N", type=whole(1), default=4, help="model replies at most (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="T", type=whole(1), default=48,
                  help="tokens at most per reply (default %(default)s)")


def observe(code: str) -> str:
    try:
        return repr(sandbox.evaluate(code))
    except sandbox.Refused as exc:
        return f"refused: {exc}"
    except sandbox.Failed as exc:
        return f"error: {exc}"


def kept(tokens: list[int]) -> int:
    """How many of a reply's ``tokens`` to keep: through the one that closes its first code block."""
    for n in range(1, len(tokens) + 1):
        if BLOCK.search(inferlet.decode(tokens[:n])):
            return n
    return len(tokens)


def next_turn(ctx: inferlet.Context, ended: bool, user: str) -> None:
    """Close the model's reply (its end token is in ``ctx`` already if ``ended``) and add a user turn
    and the cue of the model's next one, as the chat template writes them after a reply."""
    whole = inferlet.render_chat([*EXAMPLE[:1], {"role": "assistant", "content": MARK},
                                  {"role": "user", "content": user}])
    after = whole[whole.index(MARK) + len(MARK):]
    end = inferlet.decode(ctx.generated[-1:])
    ctx.fill(after[len(end):] if ended and after.startswith(end) else after)


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    turns, answer = [], None
    with inferlet.Context() as ctx:
        ctx.fill_chat([{"role": "system", "content": SYSTEM}, *EXAMPLE,
                       {"role": "user", "content": f"Task: {opt.task}"}])
        for _ in range(opt.turns):
            start = len(ctx)
            await ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=opt.max_tokens))
            tokens, ended = list(ctx.generated), bool(ctx.generated) and ctx.generated[-1] in inferlet.stop_tokens()
            keep = kept(tokens)
            reply = inferlet.decode([t for t in tokens[:keep] if t not in inferlet.stop_tokens()])
            block = BLOCK.search(reply)
            turn = {"start": start, "tokens": tokens, "reply": reply, "code": None, "observation": None}
            turns.append(turn)
            if block is None and "```" not in reply:
                answer = reply.split("Answer:", 1)[-1].strip()
                break
            ctx.truncate(start + keep)
            if block is None:  # cut off by the token budget
                turn["observation"] = "refused: the code block is not closed with ```"
            else:
                turn["code"], turn["observation"] = block[1], observe(block[1])
            next_turn(ctx, ended and keep == len(tokens), f"Observation: {turn['observation']}")
        context = ctx.tokens + ctx.pending
    inferlet.send(json.dumps({"answer": answer, "turns": turns, "context": context}))


WitWorld = inferlet.run(main)
