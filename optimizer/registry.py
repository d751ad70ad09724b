"""The policies by name: Aurelius, its arms and the references (schemas.policy.Policy is their interface)."""

from __future__ import annotations

from schemas.policy import Policy
from schemas.registry import Registry

POLICIES: Registry[Policy] = Registry("policy", ("optimizer.aurelius", "optimizer.baselines"))
register = POLICIES.register
create = POLICIES.create
names = POLICIES.names
