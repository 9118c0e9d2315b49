"""The fleet core: a group's broker membership and this sidecar's role for it, as a sans-I/O
state machine (:mod:`proxy.fleet_core.core`; its inputs and outputs in
:mod:`proxy.fleet_core.events`). It imports nothing of the proxy's I/O: no trio, no sockets,
no clock; of the engine only the error codes.
"""
