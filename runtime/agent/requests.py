"""What the provider is asked for one attempt: the call, the context it sees (bounded previews), the tools
it may use and the feedback of the attempts that failed before it."""

from __future__ import annotations

from typing import Any

from sandforge.runtime.agent.env import CallSpec
from sandforge.runtime.agent.state import Transaction
from sandforge.runtime.providers.base import AttemptFeedback, GenerationRequest
from sandforge.sandbox.context import ContextSnapshot
from sandforge.sandbox.inside.compilation import parse as parse_program
from sandforge.sandbox.inside.world import ALLOWED_MODULES

MAX_CONTEXT_KEYS_IN_PROMPT = 50
MAX_PREVIEW_CHARS = 200


def syntax_problem(code: str) -> str | None:
    """Why ``code`` is not a program at all (empty, unparsable), before the policy looks at it."""
    if not code.strip():
        return "the program is empty"
    try:
        parse_program(code, "<tool>", "exec")
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"the program cannot be parsed: {type(exc).__name__}"
    return None


def preview(value: Any) -> str:
    text = repr(value)
    if len(text) > MAX_PREVIEW_CHARS:
        text = text[: MAX_PREVIEW_CHARS - 3] + "..."
    return f"{type(value).__name__} = {text}"


def context_summary(role: str, txn: Transaction, snapshot: ContextSnapshot, keys: list[str]) -> dict[str, str]:
    """Previews of ``keys`` for the prompt, each decoded once per distinct text rather than on every call
    (a stored program runs without a model call, but its request is built all the same)."""
    cache = txn.state.previews
    known = cache.get(role, {})
    fresh: dict[str, tuple[bytes, str]] = {}
    for key in keys:
        text = snapshot[key]
        hit = known.get(key)
        fresh[key] = hit if hit is not None and hit[0] is text else (text, preview(snapshot.value(key)))
    cache[role] = fresh
    return {key: shown for key, (_, shown) in fresh.items()}


def generation_request(
    spec: CallSpec,
    attempt_number: int,
    txn: Transaction,
    feedback: list[AttemptFeedback],
    packages: tuple[str, ...] = (),
) -> GenerationRequest:
    snapshot = txn.snapshot(spec.role)
    keys = sorted(snapshot)
    return GenerationRequest(
        role=spec.role,
        method=spec.method,
        args=spec.args,
        kwargs=spec.kwargs,
        depth=spec.depth,
        attempt_number=attempt_number,
        context_keys=keys,
        context_summary=context_summary(spec.role, txn, snapshot, keys[:MAX_CONTEXT_KEYS_IN_PROMPT]),
        contract=txn.contract(spec.role),
        known_tools=sorted(txn.all_tools().values(), key=lambda t: t.role),
        allowed_modules=sorted(ALLOWED_MODULES),
        allowed_packages=list(packages),
        feedback=list(feedback),
        input_files={name: len(body) for name, body in spec.files.items()},
    )
