"""A demo tool set: plausible everyday tools with fixed latencies and canned results.

Nothing here touches the network or the real clock, so a demo run is reproducible:
the same call always returns the same text. ``latency_ms`` is the time a real
service of the kind would take (100–800 ms); pass ``registry.latency_s`` as the
executor's ``latency`` to make each call take that long.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import math
import operator

from collections.abc import Callable

from .function_schema import function_tool
from .registry import ToolRegistry

__all__ = ["demo_registry", "DEMO_LATENCY_MS_BY_TOOL", "CURRENCIES", "TIME_ZONES"]

DEMO_LATENCY_MS_BY_TOOL = {
    "get_weather": 300,
    "get_stock_price": 200,
    "search_web": 800,
    "calculate": 100,
    "convert_currency": 250,
    "get_time": 150,
}

# The frozen "now" of get_time: a wall clock would make results differ run to run.
_NOW_UTC = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
_UTC_OFFSET_HOURS_BY_ZONE = {
    "UTC": 0.0, "Europe/London": 1.0, "Europe/Paris": 2.0, "Europe/Berlin": 2.0,
    "America/New_York": -4.0, "America/Chicago": -5.0, "America/Los_Angeles": -7.0,
    "Asia/Tokyo": 9.0, "Asia/Shanghai": 8.0, "Asia/Kolkata": 5.5, "Australia/Sydney": 10.0,
}
_USD_PER_UNIT = {
    "USD": 1.0, "EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "CNY": 0.14, "INR": 0.012,
    "CHF": 1.11, "CAD": 0.73, "AUD": 0.66,
}
CURRENCIES = tuple(_USD_PER_UNIT)  # what convert_currency knows
TIME_ZONES = tuple(_UTC_OFFSET_HOURS_BY_ZONE)  # what get_time knows
_CONDITIONS = ("sunny", "partly cloudy", "cloudy", "light rain", "rain", "windy", "fog")
_SEARCH_RESULTS_BY_TOPIC = {
    "python": ["Python 3.13 release notes", "The Python Tutorial", "PEP 8 - Style Guide"],
    "weather": ["How weather forecasts work", "Reading a weather map", "Climate vs weather"],
    "llm": ["Attention Is All You Need", "Efficient memory management for LLM serving",
            "AsyncLM: asynchronous LLM function calling"],
}
# calculate('9**9**9') must not hang a worker: powers past 10**_MAX_POWER_DIGITS are refused.
_MAX_POWER_DIGITS = 300


def get_weather(city: str) -> dict:
    """Current weather for a city: temperature in Celsius, conditions and humidity."""
    digest = _digest(city.strip().lower())
    return {
        "city": city,
        "temperature_c": -5 + digest % 40,
        "conditions": _CONDITIONS[(digest >> 8) % len(_CONDITIONS)],
        "humidity_percent": 20 + (digest >> 16) % 75,
    }


def get_stock_price(symbol: str) -> dict:
    """Latest trade price of a stock ticker symbol, in US dollars."""
    digest = _digest(symbol.strip().upper())
    return {"symbol": symbol.upper(), "price_usd": round(5 + (digest % 100_000) / 100, 2)}


def search_web(query: str) -> list:
    """Search the web; returns the titles and URLs of the top three results."""
    words = query.lower().split()
    titles = next(
        (titles for topic, titles in _SEARCH_RESULTS_BY_TOPIC.items() if topic in words),
        [f"{query} - Wikipedia", f"What is {query}?", f"{query}: news and updates"],
    )
    return [
        {"title": title, "url": f"https://example.com/{_digest(title) % 10**8:08d}"}
        for title in titles
    ]


def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""
    value = _arithmetic(ast.parse(expression, mode="eval").body)
    # 10 significant digits: binary floats' last-place noise (0.1 * 3 = 0.30000000000000004) is no answer
    return float(f"{value:.10g}") if isinstance(value, float) else value


def convert_currency(amount: float, from_currency: str, to_currency: str) -> dict:
    """Convert an amount between currencies (USD, EUR, GBP, JPY, CNY, INR, CHF, CAD, AUD)."""
    rates = [_USD_PER_UNIT.get(code.upper()) for code in (from_currency, to_currency)]
    if None in rates:
        raise ValueError(f"unsupported currency; known: {', '.join(_USD_PER_UNIT)}")
    converted = amount * rates[0] / rates[1]
    return {"amount": round(converted, 2), "currency": to_currency.upper()}


def get_time(timezone: str) -> str:
    """Current local time in an IANA time zone such as 'Europe/Paris', in ISO 8601."""
    if timezone not in _UTC_OFFSET_HOURS_BY_ZONE:
        raise ValueError(f"unknown time zone {timezone!r}")
    offset = dt.timedelta(hours=_UTC_OFFSET_HOURS_BY_ZONE[timezone])
    return _NOW_UTC.astimezone(dt.timezone(offset)).isoformat()


def demo_registry() -> ToolRegistry:
    """A fresh registry of the six demo tools."""
    functions: list[Callable[..., object]] = [
        get_weather, get_stock_price, search_web, calculate, convert_currency, get_time,
    ]
    return ToolRegistry([function_tool(f, DEMO_LATENCY_MS_BY_TOOL[f.__name__]) for f in functions])


def _digest(text: str) -> int:
    # hashlib, not hash(): str hashes are salted per process.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


_BINARY_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _arithmetic(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_arithmetic(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if isinstance(node.op, ast.Pow) and _power_digits(left, right) > _MAX_POWER_DIGITS:
            raise ValueError(f"{ast.unparse(node)} is too large")
        return _BINARY_OPS[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")


def _power_digits(base: float, exponent: float) -> float:
    """About how many decimal digits ``base ** exponent`` has (0 when it is at most 1)."""
    if abs(base) <= 1:
        return 0.0
    return exponent * math.log10(abs(base))
