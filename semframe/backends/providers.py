"""Providers without a backend of their own, and how ``backend="openai"`` reaches them.

Most services speak OpenAI's Chat Completions format (some Anthropic's
Messages format), so they need no backend: ``backend="openai"`` (or
``"anthropic"``) with their ``base_url`` reaches them. A user who types
``backend="ollama"`` gets that route in the error instead of a near-miss
spelling. The routes, base URLs and key names are those of
``docs/providers.md``, one section per provider (``tests/test_bad_input.py``
checks that each is there).

Examples
--------
>>> print(route("Ollama"))  # doctest: +NORMALIZE_WHITESPACE
Ollama speaks OpenAI's API: use backend="openai", base_url="http://localhost:11434/v1",
model= the model you pulled; no key needed (with a base_url semframe sends a placeholder
key). See "Ollama" in docs/providers.md.
>>> route("mistrall") is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PROVIDERS", "Provider", "route"]


@dataclass(frozen=True, slots=True)
class Provider:
    """How to reach one provider, as ``docs/providers.md`` gives it.

    Attributes
    ----------
    title : str
        The provider's name, as the message starts.
    section : str
        Its section heading in ``docs/providers.md``.
    names : tuple of str
        What users type for it, lower case, letters and digits only
        (``"llama.cpp"`` is ``"llamacpp"``).
    route : str
        What to pass instead: backend, base URL, model.
    key : str
        Where its key goes.
    speaks : str
        Whose API format it speaks (the message goes on from ``title``).
    """

    title: str
    section: str
    names: tuple[str, ...]
    route: str
    key: str
    speaks: str = "speaks OpenAI's API"

    def advice(self) -> str:
        """What to do instead: route, key and where ``docs/providers.md`` says more."""
        return (
            f'{self.title} {self.speaks}: use {self.route}; {self.key}. See "{self.section}" '
            "in docs/providers.md."
        )


_NO_KEY = "no key needed (with a base_url semframe sends a placeholder key)"

PROVIDERS: tuple[Provider, ...] = (
    Provider(
        "Azure OpenAI",
        "Azure OpenAI",
        ("azure", "azureopenai", "azureai"),
        'backend="openai", base_url="https://YOUR-RESOURCE-NAME.openai.azure.com/openai/v1/" '
        "(or client=openai.AzureOpenAI(...)), model= your deployment name",
        'key: export OPENAI_API_KEY="$AZURE_OPENAI_API_KEY"',
    ),
    Provider(
        "Amazon Bedrock",
        "Amazon Bedrock",
        ("bedrock", "amazonbedrock", "awsbedrock", "aws"),
        'backend="openai", base_url="https://bedrock-mantle.{region}.api.aws/v1"; for Claude '
        'backend="anthropic", base_url="https://bedrock-mantle.{region}.api.aws/anthropic"',
        "key: an Amazon Bedrock API key as OPENAI_API_KEY (ANTHROPIC_API_KEY for Claude)",
        "speaks OpenAI's API (and Anthropic's, for Claude)",
    ),
    Provider(
        "Google Vertex AI",
        "Google Vertex AI (OpenAI-compatible endpoint)",
        ("vertex", "vertexai", "googlevertex", "googlevertexai"),
        'backend="openai", client=openai.OpenAI(base_url="https://us-central1-aiplatform.'
        'googleapis.com/v1beta1/projects/MY_PROJECT/locations/us-central1/endpoints/openapi", '
        'api_key=<a function returning a fresh Google access token>), model="google/<model>"',
        "key: the Google OAuth token, through that client",
    ),
    Provider(
        "Ollama",
        "Ollama",
        ("ollama",),
        'backend="openai", base_url="http://localhost:11434/v1", model= the model you pulled',
        _NO_KEY,
    ),
    Provider(
        "LM Studio",
        "LM Studio",
        ("lmstudio",),
        'backend="openai", base_url="http://localhost:1234/v1" (its server\'s default port), '
        "model= the model identifier LM Studio shows",
        _NO_KEY,
    ),
    Provider(
        "Together AI",
        "Together AI",
        ("together", "togetherai"),
        'backend="openai", base_url="https://api.together.ai/v1"',
        'key: export OPENAI_API_KEY="$TOGETHER_API_KEY"',
    ),
    Provider(
        "Groq",
        "Groq",
        ("groq",),
        'backend="openai", base_url="https://api.groq.com/openai/v1"',
        'key: export OPENAI_API_KEY="$GROQ_API_KEY"',
    ),
    Provider(
        "Fireworks AI",
        "Fireworks AI",
        ("fireworks", "fireworksai"),
        'backend="openai", base_url="https://api.fireworks.ai/inference/v1"',
        'key: export OPENAI_API_KEY="$FIREWORKS_API_KEY"',
    ),
    Provider(
        "OpenRouter",
        "OpenRouter",
        ("openrouter",),
        'backend="openai", base_url="https://openrouter.ai/api/v1"',
        "key: your OpenRouter key as OPENAI_API_KEY",
    ),
    Provider(
        "Mistral",
        "Mistral",
        ("mistral", "mistralai"),
        'backend="openai", base_url="https://api.mistral.ai/v1"',
        'key: export OPENAI_API_KEY="$MISTRAL_API_KEY"',
    ),
    Provider(
        "DeepSeek",
        "DeepSeek",
        ("deepseek",),
        'backend="openai", base_url="https://api.deepseek.com"',
        'key: export OPENAI_API_KEY="$DEEPSEEK_API_KEY"',
    ),
    Provider(
        "An SGLang or llama.cpp server",
        "Self-hosted: vLLM, SGLang, llama.cpp",
        ("sglang", "llamacpp", "llamaserver", "llamacppserver"),
        'backend="openai", base_url= the server\'s /v1 address, model= the model it serves '
        '(backend="local" runs llama.cpp in-process, no server)',
        "key: only if the server asks for one, as OPENAI_API_KEY",
    ),
    Provider(
        "litellm",
        "Why there is no litellm backend",
        ("litellm",),
        'backend="openai" (or "anthropic") with your provider\'s base_url, as '
        "docs/providers.md shows for each provider",
        "key: OPENAI_API_KEY (ANTHROPIC_API_KEY), or a client=",
        "is not a backend of semframe",
    ),
)
"""Every provider ``docs/providers.md`` describes that has no backend of its own."""

_BY_NAME = {name: p for p in PROVIDERS for name in p.names}


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def route(name: str) -> str | None:
    """How to reach the provider called ``name`` (``None``: not one ``docs/providers.md`` names).

    Spelling, case, dots, dashes and spaces do not matter: ``"LM Studio"``,
    ``"lm-studio"`` and ``"lmstudio"`` are one provider.
    """
    provider = _BY_NAME.get(_normal(name))
    return None if provider is None else provider.advice()
