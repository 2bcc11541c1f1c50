"""``[alerts]``: which alerts are raised (`gateway.reads.alerts`) and the webhooks that get
them (`gateway.edge.alerting`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationInfo, model_validator

from gateway.config.base import ConfigModel

AlertKind = Literal["halt", "order_rejected", "breaker_open", "budget", "approval_waiting",
                    "connector", "stale_feed"]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class WebhookConfig(ConfigModel):
    """One webhook: alerts are POSTed to ``url`` as JSON, signed with HMAC-SHA256 of the
    secret in ``secret_env`` (header ``X-Gateway-Signature: sha256=<hex>`` over
    ``<X-Gateway-Timestamp>.<body>``); a failed POST is tried again with backoff, up to
    ``max_attempts``, then counted as a dead letter."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    url: str = Field(pattern=r"^https?://", max_length=2_000)
    secret_env: EnvName
    kinds: tuple[AlertKind, ...] | None = None
    """The kinds it gets (default: every kind raised)."""
    timeout_ms: int = Field(default=5_000, ge=100, le=60_000)
    max_attempts: int = Field(default=5, ge=1, le=20)
    queue: int = Field(default=1_000, ge=1, le=100_000)
    """Alerts waiting for it at most; past that they are dead letters at once."""
    _secret: SecretStr = PrivateAttr(default=SecretStr(""))

    @model_validator(mode="after")
    def _secret_set(self, info: ValidationInfo) -> WebhookConfig:
        context = info.context if isinstance(info.context, Mapping) else {}
        env: Mapping[str, str] = context.get("env") or os.environ
        value = env.get(self.secret_env)
        if not value:
            raise ValueError(f"secret_env: environment variable {self.secret_env} is not set")
        self._secret = SecretStr(value)
        return self

    @property
    def secret(self) -> str:
        """The signing secret (never log it)."""
        return self._secret.get_secret_value()


class AlertsConfig(ConfigModel):
    """Which kinds of alert are raised, and where they go besides the panel."""

    rules: tuple[AlertKind, ...] = ("halt", "order_rejected", "breaker_open", "budget",
                                    "approval_waiting", "connector", "stale_feed")
    webhooks: tuple[WebhookConfig, ...] = Field(default=(), max_length=20)
