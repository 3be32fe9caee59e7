"""The flags that say how to reach a live model, shared by every command that takes ``--provider``.

Each maps to a field of ``runtime.providers.factory.ModelSettings`` (``--replay`` to the recording a replay
provider serves). No flag takes the key itself: it comes from the environment (``OPENAI_API_KEY``,
``SANDFORGE_OPENAI_API_KEY`` or the configuration file's ``openai_api_key``; ``ANTHROPIC_API_KEY``), or from the
variable ``--api-key-env`` names, so it never lands in a shell history or a process list.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

#: option name -> ModelSettings / ProviderConfig field.
FIELDS = {
    "model": "model", "base_url": "base_url", "api_key_env": "api_key_env", "temperature": "temperature",
    "max_tokens": "max_tokens", "provider_timeout": "timeout_s", "max_retries": "max_retries", "record": "record",
    "replay": "recording",
}  # fmt: skip


def model_options() -> Callable[[F], F]:
    file = click.Path(dir_okay=False, path_type=Path)
    options = [
        click.option("--model", default=None, help="Model name (default: the provider's setting, e.g. "
                     "SANDFORGE_OPENAI_MODEL, or its built-in default)."),
        click.option("--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:11434/v1 "
                     "(default: SANDFORGE_OPENAI_BASE_URL, OPENAI_BASE_URL, else OpenAI's)."),
        click.option("--api-key-env", default=None, metavar="NAME",
                     help="Environment variable holding the key (default: OPENAI_API_KEY / ANTHROPIC_API_KEY)."),
        click.option("--temperature", type=click.FloatRange(0, 2), default=None, help="Sampling temperature."),
        click.option("--max-tokens", type=click.IntRange(1), default=None, help="Largest answer, in tokens."),
        click.option("--provider-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Seconds one model request may take."),
        click.option("--max-retries", type=click.IntRange(0, 10), default=None,
                     help="Retries of 429/5xx answers (the SDK's, honouring Retry-After; default 2)."),
        click.option("--record", type=file, default=None,
                     help="Append every model exchange to FILE (JSON lines, secrets redacted)."),
        click.option("--replay", type=file, default=None, help="With --provider replay: the recording to serve."),
    ]

    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def model_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The flags that were given, as ModelSettings / ProviderConfig fields."""
    return {field: options[name] for name, field in FIELDS.items() if options.get(name) is not None}
