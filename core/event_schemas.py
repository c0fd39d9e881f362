"""Event-type schemas as a published contract: version ids, the compatibility policy, validators.

Pure: no Flink, Kafka or Cassandra. The control plane uses it when a version is added (is this
change allowed within its major?), the producer library and the delivery job when an event is
validated (does this payload match its version's schema?).

**Version ids** are ``MAJOR`` or ``MAJOR.MINOR`` (``2`` is ``2.0``). A new major may change
anything; a new minor of an existing major must be *additive* against the newest minor of that
major, so a receiver written for ``2.0`` keeps understanding every ``2.x`` event.

**The policy** (:func:`breaking_changes`), rule by rule:

=====================  ======================================================================
allowed in a minor      a new optional property whose schema accepts every value its name was
                        allowed before (under ``additionalProperties: false``, any schema; under
                        an open object, only one accepting anything, such as ``{}``); an enum
                        given more values or dropped; a type widened (``integer`` ->
                        ``number``, a second type); a bound relaxed (``maxLength`` up,
                        ``minimum`` down, removed); ``pattern``/``format`` dropped; annotations
                        (``title``, ``description``, ``examples``...)
needs a new major       ``removed``: a property (or ``$defs`` entry) is gone -- a rename is a
                        removal; ``required``: a property became required; ``type``: a type
                        narrowed or added where there was none; ``enum``/``const``: a value no
                        longer accepted; ``bound``: a bound tightened or added;
                        ``closed``: ``additionalProperties`` became false or narrower, or a
                        new property accepts less than the ``additionalProperties`` or matching
                        ``patternProperties`` that covered its name before;
                        ``unproven``: any other assertion changed (``pattern``, ``$ref``,
                        ``oneOf``...) -- the check cannot show it accepts every older event
=====================  ======================================================================

Each refusal names the JSON Pointer of the offending place in the schema.

**Validators** are the kept ``jsonschema`` library's Draft 2020-12 validator, built once per
schema version and cached (:class:`ValidatorCache`): versions are immutable once added, so a
cached validator never goes stale. (fastjsonschema compiles to faster code but implements drafts
4-7 only: it silently ignores 2020-12 keywords such as ``prefixItems`` and ``dependentRequired``,
so a payload it accepts could still break the contract; bench/schema_validation.py measures both.)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import best_match  # type: ignore[import-untyped]
from jsonschema.validators import Draft202012Validator  # type: ignore[import-untyped]

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_VERSION = re.compile(r"([1-9][0-9]{0,5})(?:\.(0|[1-9][0-9]{0,5}))?")

# Keywords that only describe: changing them never changes which payloads are valid.
_ANNOTATIONS = frozenset({"title", "description", "examples", "default", "deprecated", "readOnly",
                          "writeOnly", "$comment", "$schema", "$id", "contentMediaType", "contentEncoding"})
# Bounds: raising a lower bound or lowering an upper one narrows; adding one narrows too.
_LOWER_BOUNDS = frozenset({"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"})
_UPPER_BOUNDS = frozenset({"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"})
# Assertions whose removal widens a schema (any other change of them is unproven).
_DROPPABLE = frozenset({"pattern", "format", "multipleOf", "uniqueItems"})
# Compared structurally below.
_STRUCTURAL = frozenset({"type", "enum", "const", "required", "properties", "additionalProperties", "items",
                         "$defs"})


class SchemaVersionError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class SchemaVersion:
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> SchemaVersion:
        m = _VERSION.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise SchemaVersionError(f"schema version {text!r} must be MAJOR or MAJOR.MINOR (e.g. 2 or 2.1)")
        return cls(int(m.group(1)), int(m.group(2) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class BreakingChange:
    """One reason a schema needs a new major: ``pointer`` into the schema, which ``rule``, why."""

    pointer: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.detail} ({self.rule}; needs a new major version)"


def pointer_token(name: str) -> str:
    """RFC 6901 escaping of one reference token."""
    return name.replace("~", "~0").replace("/", "~1")


def breaking_changes(old: Any, new: Any) -> list[BreakingChange]:
    """Everything in ``new`` that a receiver of ``old`` events could not take (empty: additive)."""
    out: list[BreakingChange] = []
    _compare(old, new, "", out)
    return out


def _compare(old: Any, new: Any, ptr: str, out: list[BreakingChange]) -> None:
    if old is True:
        old = {}  # the same schema, compared keyword by keyword below
    if old == new or old is False or _accepts_anything(new):
        return  # nothing was valid before, or everything is valid now
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        out.append(BreakingChange(ptr, "unproven", "the schema was replaced by a narrower one"))
        return
    _compare_types(old, new, ptr, out)
    _compare_values(old, new, ptr, out)
    _compare_objects(old, new, ptr, out)
    _compare(old.get("items", True), new.get("items", True), f"{ptr}/items", out)
    for name, sub in (old.get("$defs") or {}).items():
        at = f"{ptr}/$defs/{pointer_token(name)}"
        if name not in (new.get("$defs") or {}):
            out.append(BreakingChange(at, "removed", f"definition {name!r} was removed"))
        else:
            _compare(sub, new["$defs"][name], at, out)
    _compare_bounds(old, new, ptr, out)
    for key in sorted((set(old) | set(new)) - _ANNOTATIONS - _STRUCTURAL - _LOWER_BOUNDS - _UPPER_BOUNDS):
        if old.get(key) == new.get(key) or (key in _DROPPABLE and key not in new):
            continue
        out.append(BreakingChange(f"{ptr}/{pointer_token(key)}", "unproven",
                                  f"{key!r} changed; only additive changes are allowed within a major"))


def _accepts_anything(schema: Any) -> bool:
    return schema is True or (isinstance(schema, Mapping) and set(schema) <= _ANNOTATIONS)


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _compare_types(old: Mapping[str, Any], new: Mapping[str, Any], ptr: str, out: list[BreakingChange]) -> None:
    old_t, new_t = _types(old), _types(new)
    if new_t is None:
        return
    lost = sorted(t for t in (old_t or {"any"}) if t not in new_t and not (t == "integer" and "number" in new_t))
    if lost:
        out.append(BreakingChange(f"{ptr}/type", "type", f"type narrowed: {', '.join(lost)} no longer accepted"))


def _compare_values(old: Mapping[str, Any], new: Mapping[str, Any], ptr: str, out: list[BreakingChange]) -> None:
    if "enum" in new:
        if "enum" not in old:
            out.append(BreakingChange(f"{ptr}/enum", "enum", "an enum was added where any value was accepted"))
        else:
            lost = [v for v in old["enum"] if v not in new["enum"]]
            if lost:
                out.append(BreakingChange(f"{ptr}/enum", "enum", f"enum narrowed: {lost!r} no longer accepted"))
    if "const" in new and old.get("const", _MISSING) != new["const"]:
        out.append(BreakingChange(f"{ptr}/const", "const", "const added or changed"))


_MISSING = object()


def _compare_objects(old: Mapping[str, Any], new: Mapping[str, Any], ptr: str, out: list[BreakingChange]) -> None:
    old_props: Mapping[str, Any] = old.get("properties") or {}
    new_props: Mapping[str, Any] = new.get("properties") or {}
    newly_required = set(new.get("required") or ()) - set(old.get("required") or ())
    for name in sorted(newly_required):
        what = "became required" if name in old_props else "was added as required (add it optional)"
        out.append(BreakingChange(f"{ptr}/properties/{pointer_token(name)}", "required", f"property {name!r} {what}"))
    for name in sorted(old_props):
        at = f"{ptr}/properties/{pointer_token(name)}"
        if name not in new_props:
            out.append(BreakingChange(at, "removed", f"property {name!r} was removed (a rename is a removal)"))
        else:
            _compare(old_props[name], new_props[name], at, out)
    for name in sorted(set(new_props) - set(old_props) - newly_required):
        _compare_new_property(old, name, new_props[name], f"{ptr}/properties/{pointer_token(name)}", out)
    old_extra, new_extra = old.get("additionalProperties", True), new.get("additionalProperties", True)
    if new_extra is False and old_extra is not False:
        out.append(BreakingChange(f"{ptr}/additionalProperties", "closed",
                                  "additionalProperties became false: unknown members were accepted before"))
    elif new_extra is not False:
        _compare(old_extra, new_extra, f"{ptr}/additionalProperties", out)


def _compare_new_property(old: Mapping[str, Any], name: str, schema: Any, at: str, out: list[BreakingChange]) -> None:
    """A property new in ``properties`` is additive only if its schema accepts every value the
    old schema let that name have: an old event may already carry it. Under an open object
    (``additionalProperties`` absent or true) only a schema that accepts anything is additive."""
    try:
        before = _old_member_schemas(old, name)
    except re.error as exc:
        out.append(BreakingChange(at, "unproven", f"new property {name!r}: an old patternProperties regex does "
                                                  f"not compile ({exc}), so what it allowed cannot be shown"))
        return
    why = ""
    for source, allowed in before:
        found: list[BreakingChange] = []
        _compare(allowed, schema, at, found)
        if not found:
            return  # an old value met every schema in ``before``, so it meets this one's superset
        why = why or f"{source} allowed it before: {found[0].detail}"
    out.append(BreakingChange(at, "closed", f"new property {name!r} accepts less than {why}"))


def _old_member_schemas(old: Mapping[str, Any], name: str) -> list[tuple[str, Any]]:
    """What the old schema required of a member ``name`` it did not list in ``properties``: each
    ``patternProperties`` schema whose regex matches, and ``additionalProperties`` if none does
    -- decided as the validator decides it (jsonschema: ``re.search``, the regexes joined by ``|``
    for "additional"). Raises re.error for a regex Python cannot compile."""
    patterns: Mapping[str, Any] = old.get("patternProperties") or {}
    before = [(f"patternProperties {p!r}", sub) for p, sub in patterns.items() if re.search(p, name)]
    if not (patterns and re.search("|".join(patterns), name)):
        before.append(("additionalProperties", old.get("additionalProperties", True)))
    return before or [("the old schema", True)]


def _compare_bounds(old: Mapping[str, Any], new: Mapping[str, Any], ptr: str, out: list[BreakingChange]) -> None:
    for key in sorted((_LOWER_BOUNDS | _UPPER_BOUNDS) & set(new)):
        before, after = old.get(key), new[key]
        if before is None:
            tightened = True
        elif key in _LOWER_BOUNDS:
            tightened = after > before
        else:
            tightened = after < before
        if tightened:
            out.append(BreakingChange(f"{ptr}/{key}", "bound", f"{key} tightened from {before} to {after}"))


# -- validation --------------------------------------------------------------------------------


class SchemaDocumentError(ValueError):
    """The document is not a JSON Schema 2020-12 schema; ``pointer`` says where."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(f"{pointer or '/'}: {message}")
        self.pointer = pointer


@dataclass(frozen=True)
class Invalid:
    """Why a payload does not match: ``pointer`` into the payload ("" is the whole document)."""

    pointer: str
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.message}"


def _to_pointer(path: Iterable[Any]) -> str:
    return "".join(f"/{pointer_token(str(p))}" for p in path)


def check_schema(document: Any) -> None:
    """Refuse anything but an object schema of draft 2020-12 (the meta-schema decides)."""
    if not isinstance(document, Mapping):
        raise SchemaDocumentError("", "a schema must be a JSON object")
    declared = document.get("$schema", DRAFT_2020_12)
    if declared != DRAFT_2020_12:
        raise SchemaDocumentError("/$schema", f"must be {DRAFT_2020_12} (or absent)")
    error = best_match(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(document))
    if error is not None:
        raise SchemaDocumentError(_to_pointer(error.absolute_path), error.message)


Validate = Callable[[Any], Invalid | None]


def compile_validator(document: Mapping[str, Any]) -> Validate:
    """A validator for one schema; returns the most relevant error (jsonschema's best_match)."""
    # No format checker: in 2020-12 ``format`` is an annotation, and which formats a checker
    # asserts depends on optional packages -- a contract must not change with the machine.
    validator = Draft202012Validator(document)

    def validate(payload: Any) -> Invalid | None:
        error = best_match(validator.iter_errors(payload))
        if error is None:
            return None
        return Invalid(_to_pointer(error.absolute_path), error.message)

    return validate


class ValidatorCache:
    """Compiled validators by a key naming an immutable schema (tenant, type, version): building
    one costs far more than a validation, and versions never change once added. Bounded (least
    recently used goes first) so a job serving many tenants holds only what it uses."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._max = max_entries
        self._entries: OrderedDict[Hashable, Validate] = OrderedDict()

    def get(self, key: Hashable, document: Mapping[str, Any]) -> Validate:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        compiled = compile_validator(document)
        self._entries[key] = compiled
        if len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["DRAFT_2020_12", "BreakingChange", "Invalid", "SchemaDocumentError", "SchemaVersion",
           "SchemaVersionError", "ValidatorCache", "breaking_changes", "check_schema", "compile_validator"]
