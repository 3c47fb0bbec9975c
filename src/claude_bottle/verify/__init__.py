"""``claude-bottle verify``: prove the isolation by attacking a bottle from inside.

- ``attack``: the one shape of an attack (its name, how it runs, how it is judged) and its ``Outcome``;
- ``suite``: the whole run (``verify``) and the attacks on one bottle (``attack``);
- ``standins``: the stand-ins (a throwaway credential, a stub upstream, hosts outside the bottle, a scratch
  workspace), the bottles started against them, and every call to the container engine;
- ``checks``, ``inspected``, ``sentinels``, ``mcp_attacks``, ``network``: the attacks by kind (``mcp_server``:
  the remote MCP server the MCP attacks go to, run in a container of the gate image);
- ``probe``: the network attacks, run in the bottle's network namespace from the gate image (``packets``: direct
  egress; ``gate_requests``: requests to the gate and inside its tunnels);
- ``report``: the table and the JSON.

Nothing is imported here: the probe runs from this package in the gate image, which has no Docker SDK.
"""
