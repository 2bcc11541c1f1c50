"""Provider gates and their limits."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gateway.edge.http import Routes, _json
from gateway.edge.views import provider_summary
from gateway.errors import BadFrame, Forbidden
from lanes import InvalidRequest
from lanes.gate.events import GateLimits, lease_too_short


class ProviderRoutes(Routes):
    """Provider gates and their limits."""

    async def providers(self, request: Request) -> Response:
        """Every provider gate: limits, usage in the current windows, waiting agents,
        breaker state and next retry."""
        principal = self._principal(request)
        principal.check_read()
        now = self.engine.clock.now_ms()
        return _json({"providers": [provider_summary(name, gate, now, principal)
                                    for name, gate in sorted(self.engine.gates.items())]})

    async def provider(self, request: Request) -> Response:
        """One provider gate (404 if there is none of that name)."""
        principal = self._principal(request)
        principal.check_read()
        gate = self._gate(request)
        return _json(provider_summary(gate.provider, gate, self.engine.clock.now_ms(),
                                      principal))

    async def provider_limits(self, request: Request) -> Response:
        """Replace a provider gate's limits (admin); they apply to requests not yet granted
        (recorded as ``GateLimitsChanged`` in the provider's stream)."""
        principal = self._principal(request)
        principal.check_admin()
        if principal.agents is not None:
            raise Forbidden("a token scoped to some agents cannot change a provider's limits "
                            "(they are shared by every agent)")
        gate = self._gate(request)
        given = await self._body(request, GateLimits)
        try:  # the keys given replace those in force; the others stay
            limits = GateLimits.model_validate({
                **gate.limits.model_dump(by_alias=False),
                **{name: getattr(given, name) for name in given.model_fields_set}})
        except ValidationError as error:
            raise InvalidRequest.from_validation_error(error) from None
        for agent_id in self.engine.agent_ids:
            short = None if self.engine.gate_of(agent_id) is not gate else lease_too_short(
                limits.lease_ms, self.engine.state(agent_id).config.run_timeout_ms, agent_id,
                gate.provider)
            if short is not None:
                raise BadFrame("invalid", f"leaseMs: {short}", field="leaseMs")
        changed = await gate.set_limits(limits)
        return _json({"changed": changed, "limits": limits.model_dump(mode="json")})
