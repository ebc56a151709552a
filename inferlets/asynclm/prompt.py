"""The system prompt, CML's texts and the worked example: the one source for the inferlet and for the
training data (``oven asynclm-data`` loads this file), so a fine-tuned model sees at run time exactly
the tokens it was trained on."""

from __future__ import annotations

RULES = """You call functions asynchronously with CML.
- To call a function, write [CALL] id [HEAD] function(arguments) [END]. The id is a new Python name.
  The call starts at once and you keep writing while it runs.
- When a call finishes, its result appears as [INTR] id [HEAD] result [END].
- Call the function that takes longest first.
- When you cannot go on without a result, write [TRAP][END] and wait.
- Tell the user each result in plain text once it is in."""

# Conventional synchronous function calling, without CML (the Sync column of the paper's Table 1).
PLAIN_RULES = """You call functions.
- To call functions, write each call on its own line as function(arguments), and nothing else.
- Their results come back in the next message, one line per call.
- Tell the user the results in plain text once they are in."""

# A few-shot example for a model that was not fine-tuned on CML (spec "example": true).
EXAMPLE = """Example.
User: What is the weather in Oslo and the price of AAPL?
Assistant: [CALL] w1 [HEAD] get_weather(city="Oslo") [END]
[CALL] p1 [HEAD] get_stock_price(symbol="AAPL") [END]
[TRAP][END]
[INTR] w1 [HEAD] {"city": "Oslo", "temp_c": 4, "sky": "rain"} [END]
[INTR] p1 [HEAD] {"symbol": "AAPL", "price": 191.2} [END]
It is 4 degrees C and raining in Oslo, and AAPL trades at 191.2."""

# The same example in conventional synchronous function calling (PLAIN_RULES).
PLAIN_EXAMPLE = """Example.
User: What is the weather in Oslo and the price of AAPL?
Assistant: get_weather(city="Oslo")
get_stock_price(symbol="AAPL")
Tool: get_weather(city="Oslo") = {"city": "Oslo", "temp_c": 4, "sky": "rain"}
get_stock_price(symbol="AAPL") = {"symbol": "AAPL", "price": 191.2}
Assistant: It is 4 degrees C and raining in Oslo, and AAPL trades at 191.2."""


def system_prompt(functions: str, cheat_sheet: list[str] | None = None, example: bool = False,
                  rules: str = RULES) -> str:
    parts = [rules] + ([PLAIN_EXAMPLE if rules == PLAIN_RULES else EXAMPLE] if example else [])
    parts.append("Functions (estimated execution time in parentheses):\n" + functions.strip())
    if cheat_sheet:  # the paper's "cheat sheet": the ground-truth calls, so every run makes the same calls
        parts.append("Cheat sheet, the calls to make:\n" + "\n".join(cheat_sheet))
    return "\n\n".join(parts)


def interrupt_text(call_id: str, value: str) -> str:
    return f"[INTR] {call_id} [HEAD] {value} [END]\n"


def call_text(call_id: str, call: str) -> str:
    return f"[CALL] {call_id} [HEAD] {call} [END]\n"


TRAP_TEXT = "[TRAP][END]\n"
