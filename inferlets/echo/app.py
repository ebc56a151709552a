"""echo: waits for client messages and answers each one, until it receives "bye".

Shows the messaging round trip: `oven run echo` then `oven send INSTANCE hello`.
Each message comes back as "echo: <text>"; the topic argument, if given, also
broadcasts every message to other instances subscribed to it.
"""

import wit_world
from wit_world.imports import futures, messaging, runtime


def main():
    args = runtime.arguments()
    topic = args[0] if args else ""
    while True:
        incoming = messaging.receive()
        while incoming not in (yield [incoming]):
            pass
        text = futures.take_text(incoming)
        if text == "bye":
            messaging.send("echo: bye")
            return
        messaging.send(f"echo: {text}")
        if topic:
            messaging.broadcast(topic, text)


_program = None


class WitWorld(wit_world.WitWorld):
    def start(self):
        global _program
        _program = main()
        return next(_program, [])

    def resume(self, ready):
        try:
            return _program.send(ready)
        except StopIteration:
            return []
