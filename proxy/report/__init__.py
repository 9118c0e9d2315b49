"""``groupgate report``: a PySpark batch job over the group-event journal.

It reads the journal (``proxy.journal``) from its Kafka topic or from files, over a time window,
and writes Parquet tables (events, members, migration, conversions, rebalances, partition
downtime, groups) and a self-contained HTML report with plots. ``session`` starts Spark
(pyspark is the optional ``report`` extra), ``source`` reads and normalizes the events,
``compute`` derives the tables, ``render`` draws the HTML, ``job`` runs it all.
``docs/pipeline.md`` defines every figure.
"""
