"""The JSON Schema file and the pydantic models agree: same structure, and the same verdict
on thousands of valid and invalid instances."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from inboxcrm.domain.extraction.llm import model_schema
from inboxcrm.schemas.extraction import (
    EVIDENCE_MAX_CHARS,
    INTENTS,
    OPTIONAL_FIELDS,
    SCHEMA_PATH,
    VALUE_MAX_CHARS,
    ExtractedField,
    Extraction,
    load_schema,
)

FIELDS = ("sender_email", "contact_name", "company")


def test_schema_is_valid_draft_2020_12() -> None:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")


def test_structure_matches_models() -> None:
    schema = load_schema()
    assert set(schema["properties"]) == set(Extraction.model_fields)
    assert set(schema["required"]) == set(Extraction.model_fields) - OPTIONAL_FIELDS
    assert schema["additionalProperties"] is False
    assert tuple(schema["properties"]["intent"]["enum"]) == INTENTS
    for name in FIELDS:
        assert schema["properties"][name]["$ref"] == "#/$defs/field"
    field = schema["$defs"]["field"]
    assert set(field["properties"]) == set(ExtractedField.model_fields)
    assert set(field["required"]) == set(ExtractedField.model_fields)
    assert field["additionalProperties"] is False
    assert field["properties"]["value"] == {"type": ["string", "null"],
                                            "maxLength": VALUE_MAX_CHARS}
    assert field["properties"]["evidence"]["type"] == ["string", "null"]
    assert field["properties"]["evidence"]["maxLength"] == EVIDENCE_MAX_CHARS
    assert field["properties"]["confidence"] == {"type": "number", "minimum": 0, "maximum": 1}
    for flag in ("possible_opt_out", "needs_human_review", "sensitive_attribute"):
        assert schema["properties"][flag]["type"] == "boolean"

    generated = Extraction.model_json_schema()
    assert set(generated["required"]) == set(schema["required"])
    assert generated["properties"]["intent"]["enum"] == list(INTENTS)


def test_model_schema_is_strict_compatible() -> None:
    """What the LLM server receives: every object closed, every property required."""
    sent = model_schema()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object":
                assert node["additionalProperties"] is False
                assert set(node["required"]) == set(node["properties"])
            assert "maxLength" not in node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(sent)
    assert sent["properties"]["intent"]["enum"] == list(INTENTS)


def _valid(rng: random.Random) -> dict[str, Any]:
    def field() -> dict[str, Any]:
        value = rng.choice([None, "jane@initech.example", "Jane Doe", "x" * VALUE_MAX_CHARS])
        return {
            "value": value,
            "confidence": rng.choice([0, 1, 0.0, 0.5, 1.0, rng.random()]),
            "evidence": rng.choice([None, "From: Jane", "e" * EVIDENCE_MAX_CHARS]),
        }

    return {
        "sender_email": field(), "contact_name": field(), "company": field(),
        "intent": rng.choice(INTENTS),
        "possible_opt_out": rng.choice([True, False]),
        "needs_human_review": rng.choice([True, False]),
    }


_BAD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 1.5, -0.1, "", "x", "x" * (VALUE_MAX_CHARS + 1),
    "e" * (EVIDENCE_MAX_CHARS + 1), [], {}, ["a"], {"value": None}, "opt_out", "maybe",
    float("inf"), 2, 0.999,
]


def _mutate(instance: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    out = copy.deepcopy(instance)
    target: dict[str, Any] = out
    if rng.random() < 0.6:
        target = out[rng.choice(FIELDS)]
    operation = rng.random()
    key = rng.choice(sorted(target))
    if operation < 0.15:
        del target[key]
    elif operation < 0.25:
        target[rng.choice(["extra", "route", "canonical_email"])] = "x"
    else:
        target[key] = rng.choice(_BAD_VALUES)
    return out


def _pydantic_ok(instance: object) -> bool:
    try:
        Extraction.model_validate(instance)
    except ValidationError:
        return False
    return True


def test_schema_and_models_agree_on_instances() -> None:
    validator = jsonschema.Draft202012Validator(load_schema())
    rng = random.Random(4)
    checked = invalid = 0
    for _ in range(3000):
        instance = _valid(rng)
        if rng.random() < 0.75:
            instance = _mutate(instance, rng)
        schema_ok = validator.is_valid(instance)
        assert schema_ok == _pydantic_ok(instance), json.dumps(instance)[:300]
        # the JSON round trip (what an LLM answer goes through) agrees as well
        text = json.dumps(instance)
        try:
            Extraction.model_validate_json(text)
            json_ok = True
        except ValidationError:
            json_ok = False
        assert json_ok == schema_ok, text[:300]
        checked += 1
        invalid += not schema_ok
    assert checked == 3000 and 500 < invalid < 2900


@pytest.mark.parametrize("bad", [[], "x", 1, None])
def test_non_objects_rejected_by_both(bad: object) -> None:
    assert not jsonschema.Draft202012Validator(load_schema()).is_valid(bad)
    assert not _pydantic_ok(bad)


def test_schema_file_is_packaged_next_to_models() -> None:
    assert SCHEMA_PATH.name == "extraction.schema.json" and SCHEMA_PATH.exists()
