"""agent-swarm: two agents, a writer and a critic, two instances of this inferlet, over messaging.

The client launches one instance per role, in either order, with the same TASK, NAME and K. The
writer drafts the task's text; for each of K rounds the critic answers the latest draft with a
critique and the writer revises by it. Each agent keeps one chat context of its own across the
rounds (greedy, M tokens a reply): the writer's turns are the task and then each critique; the
critic's, each draft. The writer's last revision is the result.

Messages go by broadcast on topics that hold NAME, the kind and the round ("NAME/draft/0", ...).
A broadcast reaches only instances subscribed at that moment, so each agent subscribes to every
topic it will hear before it says anything, and the writer says "hello" every 20 ms until the
critic (subscribed by then) answers "ready": then no message is lost, whichever started first.
Topics are the client's own (another client's instances never hear them). An agent that waits W ms
for a message in vain exits with status 1.

Sends one JSON message: {"role", "sent": [texts broadcast, in order], "received": [texts heard, in
order], "generations": [{"prompt": the context's ids before it, "tokens": ids generated, "text"}],
"result": the writer's last revision (the critic's: null)}. Handshake messages are not listed.
"""

import json

import inferlet
from inferlet.arguments import text, whole

HELLO_MS = 20
WRITER = ("You are a writer. Write what the task asks in two sentences at most. When given a critique, rewrite "
          "the text to address it.")
CRITIC = "You are a critic. Reply with one short sentence saying how the text could be improved."
MARK = "\x1fREPLY\x1f"  # stands for a reply in a rendered chat, to find the text that follows one

ARGS = inferlet.ArgumentParser("agent-swarm", __doc__)
ARGS.add_argument("role", metavar="ROLE", choices=("writer", "critic"), help="writer or critic")
ARGS.add_argument("task", metavar="TASK", type=text, help="what the writer is to write")
ARGS.add_argument("--swarm", metavar="NAME", type=text, default="swarm",
                  help="the topics' prefix, the same for both agents (default %(default)s)")
ARGS.add_argument("--rounds", metavar="K", type=whole(1, 16), default=2,
                  help="critique-and-revise rounds (default %(default)s)")
ARGS.add_argument("--max-tokens", metavar="M", type=whole(1), default=32,
                  help="tokens at most per reply (default %(default)s)")
ARGS.add_argument("--wait-ms", metavar="W", type=whole(1), default=60000,
                  help="ms to wait for a message before giving up (default %(default)s)")


class Agent:
    """One role's chat context, and what it said and heard."""

    def __init__(self, role: str, system: str, opt):
        self.role, self.system, self.opt, self.ctx = role, system, opt, inferlet.Context()
        self.sent, self.received, self.generations = [], [], []

    async def reply(self, user: str) -> str:
        """Add a user turn (after the last reply, if any) and generate the answer to it."""
        if self.generations:
            whole = inferlet.render_chat([{"role": "user", "content": "q"}, {"role": "assistant", "content": MARK},
                                          {"role": "user", "content": user}])
            after = whole[whole.index(MARK) + len(MARK):]
            end = inferlet.decode(self.ctx.generated[-1:])
            ended = self.ctx.generated[-1] in inferlet.stop_tokens()
            self.ctx.fill(after[len(end):] if ended and after.startswith(end) else after)
        else:
            self.ctx.fill_chat([{"role": "system", "content": self.system}, {"role": "user", "content": user}])
        prompt = self.ctx.tokens + self.ctx.pending
        text = (await self.ctx.generate(inferlet.Greedy(), inferlet.Stop(max_tokens=self.opt.max_tokens))).strip()
        self.generations.append({"prompt": prompt, "tokens": list(self.ctx.generated), "text": text})
        return text

    def say(self, topic: str, text: str) -> None:
        inferlet.broadcast(topic, text)
        self.sent.append(text)

    async def hear(self, future: inferlet.Future, what: str) -> str:
        text = await within(future, self.opt.wait_ms, what)
        self.received.append(text)
        return text


async def within(future: inferlet.Future, ms: int, what: str) -> str:
    """``future``'s value, or exit 1 if it has not come within ``ms``."""
    either = inferlet.Future()
    for f in (future, inferlet.sleep(ms)):
        f.add_done_callback(lambda _: either.done() or either.set_result(None))
    await either
    if not future.done():
        raise SystemExit(f"agent-swarm: {what} did not come within {ms} ms")
    return future.result()


def topic(opt, kind: str, n: int = 0) -> str:
    return f"{opt.swarm}/{kind}/{n}"


async def writer(task: str, opt) -> Agent:
    agent, rounds = Agent("writer", WRITER, opt), opt.rounds
    ready = inferlet.subscribe(topic(opt, "ready"))
    critiques = [inferlet.subscribe(topic(opt, "critique", r)) for r in range(rounds)]
    waited = 0
    while not ready.poll_now().done():  # the critic may not have subscribed yet: say hello until it answers
        if waited >= opt.wait_ms:
            raise SystemExit(f"agent-swarm: no critic answered on swarm {opt.swarm!r} within {waited} ms")
        inferlet.broadcast(topic(opt, "hello"), "hello")
        await inferlet.sleep(HELLO_MS)
        waited += HELLO_MS
    draft = await agent.reply(f"Task: {task}")
    for r in range(rounds):
        agent.say(topic(opt, "draft", r), draft)
        critique = await agent.hear(critiques[r], f"critique {r}")
        draft = await agent.reply(f"Critique: {critique}\nRewrite the text.")
    agent.result = draft
    return agent


async def critic(task: str, opt) -> Agent:
    agent, rounds = Agent("critic", CRITIC, opt), opt.rounds
    hello = inferlet.subscribe(topic(opt, "hello"))
    drafts = [inferlet.subscribe(topic(opt, "draft", r)) for r in range(rounds)]
    await within(hello, opt.wait_ms, f"a writer's hello on swarm {opt.swarm!r}")
    inferlet.broadcast(topic(opt, "ready"), "ready")
    for r in range(rounds):
        draft = await agent.hear(drafts[r], f"draft {r}")
        agent.say(topic(opt, "critique", r), await agent.reply(f"Task: {task}\nText: {draft}"))
    agent.result = None
    return agent


async def main(args: list[str]) -> None:
    opt = ARGS.parse(args)
    agent = await (writer if opt.role == "writer" else critic)(opt.task, opt)
    agent.ctx.close()
    inferlet.send(json.dumps({"role": opt.role, "sent": agent.sent, "received": agent.received,
                              "generations": agent.generations, "result": agent.result}))


WitWorld = inferlet.run(main)
