"""Simulation of KIP-848 consumer groups without a network.

``client`` implements the consumer member state machine of the client design (join,
reconcile by revoking then assigning, acknowledge, fenced -> rejoin, leave); ``simulator``
runs many such clients against a :class:`~translation.coordinator.GroupCoordinator` in a
seeded discrete-event loop with random joins, leaves, crashes, static bounces, lost and
delayed messages, slow revocations, subscription and topic changes, checking the protocol's
invariants (``invariants``) after every event; ``classic_client`` is a classic-protocol consumer
(eager or cooperative) mixed into the same scenarios. Everything is pure code: time is
simulated.
"""

from translation.simulation.invariants import InvariantViolation, OwnershipTracker
from translation.simulation.simulator import SimulationResult, run_seed, run_seeds

__all__ = ["InvariantViolation", "OwnershipTracker", "SimulationResult", "run_seed", "run_seeds"]
