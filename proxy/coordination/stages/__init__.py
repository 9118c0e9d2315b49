"""The coordinating router's stages: a group request's way from its frame to its handler and back.

Each module holds one stage (:mod:`.stage`: what a stage is, a request's passage, the chain
that runs them). A connection has one of two lists, composed by
:mod:`proxy.coordination.routing`:

=====================  ========================================================================
an application's       :mod:`.decode` (and KIP-848 epochs caught up), :mod:`.liveness`,
connection             :mod:`.authorize`, :mod:`.conversion`, :mod:`.fleet_route`,
                       :mod:`~proxy.coordination.offsets.retries` (OffsetCommit),
                       :mod:`.relay` (commit tickets: :mod:`~proxy.coordination.offsets.ticketed`),
                       :mod:`.stepped_down`, :mod:`.dispatch` (:class:`~.dispatch.Dispatch`)
a relay from another   :mod:`.decode` (the relay mark), :mod:`.relayers`, :mod:`.held_here`,
sidecar                :mod:`.stepped_down`, :mod:`.dispatch` (:class:`~.dispatch.DispatchRelayed`)
=====================  ========================================================================

Every answer goes back through the list's answer hooks, last stage first, and is encoded at
the client's version (:meth:`.stage.Chain.encode`).
"""
