"""``oven asynclm --list-tools``: a registry's tools as a person or a program reads them."""

from __future__ import annotations

from .registry import ToolRegistry

__all__ = ["tool_lines", "tools_document"]


def tool_lines(registry: ToolRegistry) -> list[str]:
    """Per tool: its signature and estimated time, then its description and each parameter's, indented::

        get_weather(city: str)  [300 ms]
            Current weather for a city.
            city: The city, e.g. "Paris".
    """
    lines = []
    for tool in registry:
        lines.append(f"{tool.signature}  [{tool.latency_ms:.0f} ms]")
        if tool.description:
            lines.append(f"    {' '.join(tool.description.split())}")
        for name, prop in _properties(tool.schema).items():
            if isinstance(prop, dict) and prop.get("description"):
                lines.append(f"    {name}: {' '.join(str(prop['description']).split())}")
    return lines


def tools_document(registry: ToolRegistry) -> dict:
    """``{"tools": [...]}``, each with name, signature, description, latency_ms and parameters (the
    JSON schema of its arguments; null where its source gives none)."""
    return {"tools": [
        {"name": tool.name, "signature": tool.signature, "description": tool.description,
         "latency_ms": tool.latency_ms, "parameters": tool.schema["parameters"] if tool.schema else None}
        for tool in registry
    ]}


def _properties(schema: dict | None) -> dict:
    parameters = (schema or {}).get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return properties if isinstance(properties, dict) else {}
