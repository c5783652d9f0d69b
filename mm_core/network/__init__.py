"""A sandboxed command's and fetch_content's way out: the egress policy, and the proxy that applies it.

`network: off | allow | open` (docs/network.md). With `allow`, a command's network namespace holds nothing but
its loopback, where a port of the worker's proxy (proxy.py) is bound: every request goes through it, is checked
against the policy (policy.py) and the SSRF guard, and credentials are added there, outside the sandbox.
"""

from mm_core.network.policy import NETWORK_OFF, NOT_LISTED, EgressPolicy, Rule, expand, normal_host, presets

__all__ = ["NETWORK_OFF", "NOT_LISTED", "EgressPolicy", "Rule", "expand", "normal_host", "presets"]
