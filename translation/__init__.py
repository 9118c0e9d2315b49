"""The KIP-848 group engine and the classic-protocol translation, sans-I/O.

Nothing in this package opens a socket, imports trio or reads a clock: requests and the
current time go in, responses, timers to arm and state changes come out. The proxy (``proxy/``)
drives it; the simulator and the unit tests drive it without any network.
"""
