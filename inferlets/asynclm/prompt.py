"""The system prompt: CML's rules, worked examples, the functions and how long each takes."""

from __future__ import annotations

RULES = """You call functions asynchronously with CML.
- To call a function, write [CALL] id [HEAD] function(arguments) [END]. The id is a new Python name.
  The call starts at once and you keep writing while it runs.
- When a call finishes, its result appears as [INTR] id [HEAD] result [END].
- Call the function that takes longest first.
- When you cannot go on without a result, write [TRAP][END] and wait.
- When every result you need is in, answer the user in plain text."""

EXAMPLE = """Example.
User: What is the weather in Oslo and the price of AAPL?
Assistant: [CALL] w1 [HEAD] get_weather(city="Oslo") [END]
[CALL] p1 [HEAD] get_stock_price(symbol="AAPL") [END]
[TRAP][END]
[INTR] w1 [HEAD] {"city": "Oslo", "temp_c": 4, "sky": "rain"} [END]
[INTR] p1 [HEAD] {"symbol": "AAPL", "price": 191.2} [END]
It is 4 degrees C and raining in Oslo, and AAPL trades at 191.2."""


def system_prompt(functions: str, cheat_sheet: list[str] | None = None) -> str:
    parts = [RULES, EXAMPLE, "Functions (estimated execution time in brackets):\n" + functions.strip()]
    if cheat_sheet:  # the paper's "cheat sheet": the ground-truth calls, so every run makes the same calls
        parts.append("Cheat sheet, the calls to make:\n" + "\n".join(cheat_sheet))
    return "\n\n".join(parts)


def interrupt_text(call_id: str, value: str) -> str:
    return f"[INTR] {call_id} [HEAD] {value} [END]\n"


def call_text(call_id: str, call: str) -> str:
    return f"[CALL] {call_id} [HEAD] {call} [END]\n"


TRAP_TEXT = "[TRAP][END]\n"
