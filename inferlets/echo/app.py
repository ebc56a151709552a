"""echo: waits for client messages and answers each one, until it receives "bye".

Shows the messaging round trip: `oven run echo` then `oven send INSTANCE hello`.
Each message comes back as "echo: <text>"; the topic argument, if given, also
broadcasts every message to other instances subscribed to it.
"""

from oven_inferlet import wait_all, world
from wit_world.imports import futures, messaging, runtime


def main():
    args = runtime.arguments()
    topic = args[0] if args else ""
    while True:
        incoming = messaging.receive()
        yield from wait_all([incoming])
        text = futures.take_text(incoming)
        if text == "bye":
            messaging.send("echo: bye")
            return
        messaging.send(f"echo: {text}")
        if topic:
            messaging.broadcast(topic, text)


WitWorld = world(main)
