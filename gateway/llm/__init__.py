"""LLM providers and reasoners: what the gateway needs from a provider (`port`), the Anthropic
and OpenAI clients, the fake provider for tests, and the reasoners that turn a run into
calls."""
