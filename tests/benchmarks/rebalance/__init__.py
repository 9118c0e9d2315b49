"""The rebalance benchmark: real consumer groups on a target, one scenario at a time.

``targets`` (what members connect to), ``members`` (member and producer processes),
``scenarios`` (one run: group, event, timeline), ``timeline`` (ownership replay and the
metrics, pure), ``report`` (table and pictures). ``dev/bench rebalance`` drives them.
"""
