"""JSON Schemas for constrained-output tests: ``SCHEMAS``, a list of ``(name, schema)``.

Each is small enough to fill in a few dozen tokens (strings and arrays mostly bounded), and together
they cover what structured output meets: nested objects, arrays with minItems/maxItems, enums and
consts, integers and numbers with bounds, required and optional properties, anyOf, $ref/$defs
(chained; a recursive one compiles too, but SmolLM2 greedy nests it until max_tokens), and strings
with lengths, patterns and formats. ``name`` is a valid OpenAI
``json_schema.name`` and a phrase to prompt with ("a person", "an address", ...). Validate an output
with ``jsonschema.validate(value, schema, format_checker=FORMAT_CHECKER)``: formats are checked
where jsonschema can without extra packages (date, email, ipv4, ipv6, uuid).
"""

from __future__ import annotations

import jsonschema

FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def _obj(properties: dict, required: list[str] | None = None, **extra) -> dict:
    """An object of ``properties`` (all required unless ``required`` says which), no others."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False,
            **extra}


NAME = {"type": "string", "minLength": 1, "maxLength": 24}
WORD = {"type": "string", "minLength": 1, "maxLength": 12}
SHORT = {"type": "string", "maxLength": 40}

SCHEMAS: list[tuple[str, dict]] = [
    # -- flat objects, scalar types ------------------------------------------------------------------
    ("person", _obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("city", _obj({"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0}})),
    ("book", _obj({"title": SHORT, "author": NAME, "year": {"type": "integer", "minimum": 1400, "maximum": 2030}})),
    ("product", _obj({"name": NAME, "price": {"type": "number", "minimum": 0, "maximum": 10000},
                      "in_stock": {"type": "boolean"}})),
    ("temperature_reading", _obj({"celsius": {"type": "number", "minimum": -90, "maximum": 60}})),
    ("coordinates", _obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                          "lon": {"type": "number", "minimum": -180, "maximum": 180}})),
    ("score", _obj({"points": {"type": "integer", "minimum": 0, "maximum": 10},
                    "passed": {"type": "boolean"}})),
    ("percentage", _obj({"value": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 100}})),
    ("dice_roll", _obj({"roll": {"type": "integer", "minimum": 1, "maximum": 6}})),
    ("nothing", _obj({"value": {"type": "null"}})),
    ("yes_or_no", {"type": "boolean"}),
    ("small_integer", {"type": "integer", "minimum": -5, "maximum": 5}),
    ("short_word", WORD),
    # -- enums and consts ----------------------------------------------------------------------------
    ("traffic_light", _obj({"color": {"enum": ["red", "amber", "green"]}})),
    ("sentiment", _obj({"label": {"enum": ["positive", "negative", "neutral"]},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
    ("http_status", _obj({"code": {"enum": [200, 301, 404, 500]}, "reason": SHORT})),
    ("weekday", {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]}),
    ("versioned_record", _obj({"version": {"const": 2}, "kind": {"const": "record"}, "id": WORD})),
    ("mixed_enum", _obj({"value": {"enum": ["auto", 0, True, None]}})),
    # -- required and optional -----------------------------------------------------------------------
    ("contact", _obj({"name": NAME, "phone": WORD, "email": {"type": "string", "format": "email", "maxLength": 40}},
                     required=["name"])),
    ("user_profile", _obj({"username": WORD, "bio": SHORT, "age": {"type": "integer", "minimum": 13, "maximum": 99}},
                          required=["username"])),
    ("settings", _obj({"dark_mode": {"type": "boolean"}, "font_size": {"type": "integer", "minimum": 8,
                                                                        "maximum": 32}}, required=[])),
    ("open_object", {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}}, "required": ["id"],
                     "maxProperties": 3}),
    # -- arrays --------------------------------------------------------------------------------------
    ("three_colours", _obj({"colours": {"type": "array", "items": WORD, "minItems": 3, "maxItems": 3}})),
    ("shopping_list", _obj({"items": {"type": "array", "items": WORD, "minItems": 1, "maxItems": 5}})),
    ("lottery_numbers", {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 49},
                         "minItems": 6, "maxItems": 6}),
    ("empty_or_short_list", _obj({"tags": {"type": "array", "items": WORD, "maxItems": 2}})),
    ("matrix", _obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2,
                              "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "minItems": 2, "maxItems": 2}}})),
    ("team", _obj({"team": NAME, "members": {"type": "array", "minItems": 2, "maxItems": 3, "items": _obj(
        {"name": NAME, "role": {"enum": ["lead", "dev", "qa"]}})}})),
    ("pair", {"type": "array", "prefixItems": [WORD, {"type": "integer", "minimum": 0, "maximum": 100}],
              "items": False, "minItems": 2}),
    ("boolean_flags", {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4}),
    # -- nested objects ------------------------------------------------------------------------------
    ("address", _obj({"street": SHORT, "city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("customer", _obj({"name": NAME, "address": _obj({"city": NAME, "country": NAME})})),
    ("order", _obj({"order_id": {"type": "integer", "minimum": 1},
                    "lines": {"type": "array", "minItems": 1, "maxItems": 2,
                              "items": _obj({"sku": WORD, "quantity": {"type": "integer", "minimum": 1,
                                                                       "maximum": 10}})}})),
    ("deeply_nested", _obj({"a": _obj({"b": _obj({"c": _obj({"d": {"type": "integer", "minimum": 0,
                                                                       "maximum": 9}})})})})),
    ("event", _obj({"title": SHORT, "when": _obj({"date": {"type": "string", "format": "date"},
                                                  "all_day": {"type": "boolean"}}),
                    "attendees": {"type": "integer", "minimum": 0, "maximum": 500}})),
    ("recipe", _obj({"dish": NAME, "servings": {"type": "integer", "minimum": 1, "maximum": 8},
                     "ingredients": {"type": "array", "minItems": 2, "maxItems": 3,
                                     "items": _obj({"item": WORD, "grams": {"type": "integer", "minimum": 1,
                                                                            "maximum": 1000}})}})),
    # -- anyOf ---------------------------------------------------------------------------------------
    ("id_or_name", _obj({"key": {"anyOf": [{"type": "integer", "minimum": 0}, WORD]}})),
    ("shape", {"anyOf": [_obj({"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0,
                                                                          "maximum": 100}}),
                         _obj({"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0,
                                                                        "maximum": 100}})]}),
    ("optional_note", _obj({"note": {"anyOf": [SHORT, {"type": "null"}]}})),
    ("payment", _obj({"amount": {"type": "number", "minimum": 0, "maximum": 1000},
                      "method": {"anyOf": [_obj({"card_last4": {"type": "string", "pattern": "^[0-9]{4}$"}}),
                                           _obj({"iban_country": {"type": "string", "pattern": "^[A-Z]{2}$"}})]}})),
    ("nullable_count", _obj({"count": {"type": ["integer", "null"], "minimum": 0, "maximum": 99}})),
    # -- $ref / $defs --------------------------------------------------------------------------------
    ("delivery", {"$defs": {"place": _obj({"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})},
                  **_obj({"from": {"$ref": "#/$defs/place"}, "to": {"$ref": "#/$defs/place"}})}),
    ("rgb_palette", {"$defs": {"channel": {"type": "integer", "minimum": 0, "maximum": 255},
                               "rgb": _obj({"r": {"$ref": "#/$defs/channel"}, "g": {"$ref": "#/$defs/channel"},
                                            "b": {"$ref": "#/$defs/channel"}})},
                     **_obj({"colors": {"type": "array", "items": {"$ref": "#/$defs/rgb"}, "minItems": 1,
                                        "maxItems": 2}})}),
    ("tree_node", {"$defs": {"leaf": _obj({"value": {"type": "integer", "minimum": 0, "maximum": 9}}),
                             "node": _obj({"value": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"},
                                                        "maxItems": 2}}, required=["value"])},
                   "$ref": "#/$defs/node"}),
    ("money", {"$defs": {"currency": {"enum": ["USD", "EUR", "GBP"]}},
               **_obj({"amount": {"type": "number", "minimum": 0, "maximum": 100},
                       "currency": {"$ref": "#/$defs/currency"}})}),
    # -- strings: lengths, patterns, formats ---------------------------------------------------------
    ("product_code", _obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}})),
    ("hex_colour", _obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("us_phone", _obj({"phone": {"type": "string", "pattern": "^\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}$"}})),
    ("initials", _obj({"initials": {"type": "string", "minLength": 2, "maxLength": 3, "pattern": "^[A-Z]+$"}})),
    ("birthday", _obj({"date": {"type": "string", "format": "date"}})),
    ("email_address", _obj({"email": {"type": "string", "format": "email", "maxLength": 40}})),
    ("server", _obj({"host": {"type": "string", "format": "ipv4"}, "port": {"type": "integer", "minimum": 1,
                                                                            "maximum": 65535}})),
    ("ipv6_host", _obj({"address": {"type": "string", "format": "ipv6", "maxLength": 39}})),
    ("record_id", _obj({"id": {"type": "string", "format": "uuid"}})),
    ("timestamp", _obj({"at": {"type": "string", "format": "date-time"}})),
    ("slug", _obj({"slug": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 30}})),
    ("version_string", _obj({"version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$",
                                         "maxLength": 14}})),
]
