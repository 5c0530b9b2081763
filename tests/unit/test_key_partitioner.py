"""``scheduler.kafka.KeyPartitioner`` chooses what aiokafka's default partitioner chooses."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner

from scheduler.kafka import KeyPartitioner


def test_it_agrees_with_the_default_partitioner_for_every_key_and_count() -> None:
    rng = random.Random(5)
    ours, theirs = KeyPartitioner(keys=64), DefaultPartitioner()
    keys = [rng.randbytes(rng.randrange(1, 40)) for _ in range(500)]
    for key in keys * 2:  # the second pass from the cache (and past its bound: cleared)
        count = rng.randrange(1, 65)
        partitions = list(range(count))
        assert ours(key, partitions, partitions) == theirs(key, partitions, partitions), key


def test_a_message_without_a_key_goes_to_an_available_partition() -> None:
    assert KeyPartitioner()(None, [0, 1, 2], [2]) == 2
