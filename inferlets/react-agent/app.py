"""react-agent: a ReAct loop (Thought / Action / Observation) whose tools the client runs.

Each step the inferlet writes "Thought:", the model a line (greedy, up to T tokens, ending at a
newline), the inferlet "Action:", the model the action line. An action "name(arguments)" goes
to the client as {"type": "call", "id": "1", "call": "name(arguments)"}; the inferlet waits for
{"type": "result", "id": "1", "value": ..., "ok": true|false} (other messages are ignored) and
fills "Observation: value" ("error: value" when not ok). "finish(answer)" ends the loop; any
other action is malformed and observed as an error, so the model can correct itself. At the
answer, or after N steps, it sends {"type": "final", "text": answer or null, "steps": n}.
--pin fixes the next step's action (repeat it for more steps; AsyncLM calls this a plan): the
model still writes the thought, and the pinned action is handled like one it wrote. --trace
adds "trace" to the final message: the whole context in order as [writer, token ids] parts,
written by "inferlet" (prompt, labels, observations) or "model" (with each token's probability
as a third item).
"""

import json
import re
import sys

import inferlet
from inferlet.arguments import whole

TOOLS = "calc(expression) evaluates arithmetic; search(query) looks a topic up"
PROMPT = ("Answer the question. At each step write a Thought line, then an Action line calling one tool as "
          "name(arguments), or finish(answer) when you know the answer. The Observation line is its result.\n"
          "Tools: {tools}\nQuestion: {question}\n")
ACTION = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)")


ARGS = inferlet.ArgumentParser("react-agent", __doc__)
ARGS.add_argument("question", metavar="QUESTION", help="the question")
ARGS.add_argument("--tools", metavar="DESCRIPTION", default=TOOLS,
                  help="the tools, as the prompt lists them (default %(default)r)")
ARGS.add_argument("--steps", metavar="N", type=whole(1), default=4, help="steps at most (default %(default)s)")
ARGS.add_argument("--tokens", metavar="T", type=whole(1), default=32,
                  help="tokens at most in a line the model writes (default %(default)s)")
ARGS.add_argument("--pin", metavar="CALL", action="append", default=[],
                  help="the next step's action (repeat it for more steps)")
ARGS.add_argument("--trace", action="store_true", help="add the whole context, by writer, to the final message")


class Transcript:
    """The agent's context, with a record of who wrote which tokens."""

    def __init__(self):
        self.ctx, self.parts = inferlet.Context(), []

    def fill(self, text: str) -> None:
        tokens = inferlet.encode(text)
        self.ctx.fill_tokens(tokens)
        self.parts.append(["inferlet", tokens])

    async def line(self, max_tokens: int) -> str:
        """The model's next line, greedy, up to a newline, an end token or ``max_tokens``; a newline
        is filled in when the model left the line open. The trace keeps each token's probability."""
        tokens, probs, end = [], [], inferlet.stop_tokens()
        while len(tokens) < max_tokens and not (tokens and tokens[-1] in end) and "\n" not in inferlet.decode(tokens):
            dist = await self.ctx.next_dist(top_k=1)
            tokens.append(dist.token_ids[0])
            probs.append(dist.probs[0])
            self.ctx.fill_tokens(tokens[-1:])
        self.parts.append(["model", tokens, probs])
        text = inferlet.decode([t for t in tokens if t not in end])
        if "\n" not in text:
            self.fill("\n")
        return text.split("\n")[0].strip()


async def call(call_id: str, action: str) -> str:
    """Send ``action`` to the client and wait for its result; the observation."""
    inferlet.send(json.dumps({"type": "call", "id": call_id, "call": action}))
    while True:
        try:
            reply = json.loads(await inferlet.receive())
        except ValueError:
            reply = None
        if isinstance(reply, dict) and reply.get("type") == "result" and reply.get("id") == call_id:
            value = reply.get("value")
            value = value if isinstance(value, str) else json.dumps(value)
            return value if reply.get("ok", True) else f"error: {value}"
        print(f"react-agent: ignoring a message that is not the result of call {call_id}", file=sys.stderr)


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    transcript, answer, calls, step = Transcript(), None, 0, 0
    transcript.fill(PROMPT.format(tools=opt.tools, question=opt.question))
    while answer is None and step < opt.steps:
        step += 1
        transcript.fill("Thought:")
        await transcript.line(opt.tokens)
        transcript.fill("Action:")
        if step <= len(opt.pin):
            action = opt.pin[step - 1]
            transcript.fill(f" {action}\n")
        else:
            action = await transcript.line(opt.tokens)
        m = ACTION.fullmatch(action)
        if m and m[1] == "finish":
            answer = m[2].strip()
        elif m:
            calls += 1
            transcript.fill(f"Observation: {await call(str(calls), action)}\n")
        else:
            transcript.fill(f"Observation: error: malformed action {action!r}; write name(arguments) or finish(answer)\n")
    final = {"type": "final", "text": answer, "steps": step}
    if opt.trace:
        final["trace"] = transcript.parts
    inferlet.send(json.dumps(final))
    transcript.ctx.close()


WitWorld = inferlet.run(main)
