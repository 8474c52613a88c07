"""Reads a Starling MCAP file with the independent PyPI `mcap` reader and
checks what Foxglove relies on: each topic's schema name and encodings,
JSON bodies, every point cloud and scene update valid against Foxglove's
own published JSON schemas (`foxglove/`, from foxglove-sdk), point clouds
with one point per boid the metrics count at the same time, a scene with
the world box, and metrics in tick order.

Usage: python3 read_back.py FILE.mcap
Exit 0 and one summary line on success; a message naming what is wrong
otherwise. Run by `cargo xtask test`.
"""

import base64
import json
import math
import pathlib
import struct
import sys

from jsonschema import Draft202012Validator
from mcap.reader import make_reader

# Foxglove's JSON schemas, as foxglove-sdk publishes them (MIT licence).
FOXGLOVE = pathlib.Path(__file__).parent / "foxglove"
OFFICIAL = {
    name: Draft202012Validator(json.loads((FOXGLOVE / f"{name.split('.')[1]}.json").read_text()))
    for name in ("foxglove.PointCloud", "foxglove.SceneUpdate")
}

EXPECTED = {
    "/boids": "foxglove.PointCloud",
    "/scene": "foxglove.SceneUpdate",
    "/metrics": "starling.Metrics",
}


def fail(msg):
    print(f"read_back: {msg}", file=sys.stderr)
    sys.exit(1)


def main(path):
    counts = {topic: 0 for topic in EXPECTED}
    points = {}
    population = {}
    last_tick = -1
    last_time = -1
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        if summary is None:
            fail("no summary section")
        for schema, channel, message in reader.iter_messages():
            topic = channel.topic
            if EXPECTED.get(topic) != schema.name:
                fail(f"{topic}: schema {schema.name!r}, expected {EXPECTED.get(topic)!r}")
            if (schema.encoding, channel.message_encoding) != ("jsonschema", "json"):
                fail(f"{topic}: encodings {schema.encoding}/{channel.message_encoding}")
            json.loads(schema.data)
            body = json.loads(message.data)
            official = OFFICIAL.get(schema.name)
            if official is not None:
                error = next(official.iter_errors(body), None)
                if error is not None:
                    where = "/".join(str(p) for p in error.path)
                    fail(f"{topic}: not a valid {schema.name} at {where or 'the top'}: {error.message[:200]}")
            if message.log_time < last_time:
                fail(f"{topic}: log time went back to {message.log_time}")
            last_time = message.log_time
            counts[topic] += 1
            if topic == "/boids":
                data = base64.b64decode(body["data"])
                stride = body["point_stride"]
                names = [fld["name"] for fld in body["fields"]]
                if names[:3] != ["x", "y", "z"] or any(fld["type"] != 7 for fld in body["fields"]):
                    fail(f"/boids: fields {body['fields']}")
                if stride != 4 * len(names) or len(data) % stride:
                    fail(f"/boids: {len(data)} bytes in points of {stride} for {names}")
                points[message.log_time] = len(data) // stride
                for (x,) in struct.iter_unpack("<f", data):
                    if not math.isfinite(x):
                        fail("/boids: a value is not finite")
            elif topic == "/scene":
                ids = [e["id"] for e in body["entities"]]
                if "world" not in ids:
                    fail(f"/scene: no world box in {ids}")
            else:
                tick = body["tick"]["tick"]
                if tick <= last_tick:
                    fail(f"/metrics: tick {tick} after {last_tick}")
                last_tick = tick
                population[message.log_time] = body["tick"]["population"]
                if not 0 <= body["swarm"]["order"] <= 1:
                    fail(f"/metrics: order {body['swarm']['order']}")
    if min(counts.values()) == 0:
        fail(f"a topic is empty: {counts}")
    if points != population:
        fail("the point clouds do not hold one point per boid the metrics count")
    print(f"read_back: {path}: {counts}, last tick {last_tick}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: read_back.py FILE.mcap")
    main(sys.argv[1])
