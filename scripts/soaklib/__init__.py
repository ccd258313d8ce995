"""The soak's parts; ``scripts/soak.py`` (``make soak``) puts them together, tests/integration/test_faults.py
reuses the producers, consumers and checks.

* :mod:`.records`: what a record carries, and the ledger of every acknowledged one;
* :mod:`.producers` and :mod:`.consumers`: the client threads (confluent-kafka, kafka-python, aiokafka);
* :mod:`.checks`: one consumer's deliveries of one partition against the ledger;
* :mod:`.lake`: the archiver (what ``ksi archive`` and retention do);
* :mod:`.faults`: quiescing, kill -9 of the broker or of ksi, and noida's state file;
* :mod:`.proxy`: ``python -m ksi serve`` as a child process, and its config;
* :mod:`.report`: progress lines and the final table.
"""
