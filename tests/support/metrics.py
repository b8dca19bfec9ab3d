"""Prometheus text for a snapshot, parsed back: what a scrape of `runner/prometheus.families` gives."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ratedeck.engine.snapshot import Snapshot
from ratedeck.runner.prometheus import families


def scrape(snap: Snapshot) -> dict:
    """Each metric family of `snap`'s exposition text, by name (as a scraper parses it)."""

    class Fixed(Collector):
        def collect(self):
            return iter(families(snap))

    registry = CollectorRegistry()
    registry.register(Fixed())
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def by_labels(family, *names: str) -> dict:
    """A family's sample values by the values of the labels `names`."""
    return {tuple(s.labels[n] for n in names): s.value for s in family.samples}
