"""Reads a Starling MCAP file with the independent PyPI `mcap` reader and
checks what Foxglove and Rerun rely on: each topic's schema name and
encodings; the point clouds and scene updates decoded as protobuf with the
descriptors the file itself carries (PyPI `mcap-protobuf-support`, as
Foxglove and Rerun decode them), each message of the Foxglove type its
schema names; point clouds of FLOAT32 fields with one point per boid the
metrics count at the same time; a scene with the world box; JSON metrics
in tick order.

Usage: python3 read_back.py FILE.mcap
Exit 0 and one summary line on success; a message naming what is wrong
otherwise. Run by `cargo xtask test`.
"""

import json
import math
import struct
import sys

from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory

ENCODINGS = {
    "/boids": ("protobuf", "protobuf"),
    "/scene": ("protobuf", "protobuf"),
    "/metrics": ("jsonschema", "json"),
}
# foxglove.PackedElementField.NumericType FLOAT32
FLOAT32 = 7

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
    decoders = DecoderFactory()
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        if summary is None:
            fail("no summary section")
        for schema, channel, message in reader.iter_messages():
            topic = channel.topic
            if EXPECTED.get(topic) != schema.name:
                fail(f"{topic}: schema {schema.name!r}, expected {EXPECTED.get(topic)!r}")
            if (schema.encoding, channel.message_encoding) != ENCODINGS[topic]:
                fail(f"{topic}: encodings {schema.encoding}/{channel.message_encoding}")
            if channel.message_encoding == "protobuf":
                decode = decoders.decoder_for("protobuf", schema)
                if decode is None:
                    fail(f"{topic}: no protobuf decoder for schema {schema.name}")
                try:
                    body = decode(message.data)
                except Exception as e:  # noqa: BLE001 - any decoding failure is the finding
                    fail(f"{topic}: does not decode as {schema.name}: {e}")
                if body.DESCRIPTOR.full_name != schema.name:
                    fail(f"{topic}: decoded a {body.DESCRIPTOR.full_name}, schema says {schema.name}")
            else:
                json.loads(schema.data)
                body = json.loads(message.data)
            if message.log_time < last_time:
                fail(f"{topic}: log time went back to {message.log_time}")
            last_time = message.log_time
            counts[topic] += 1
            if topic == "/boids":
                data = body.data
                stride = body.point_stride
                names = [fld.name for fld in body.fields]
                if names[:3] != ["x", "y", "z"] or any(fld.type != FLOAT32 for fld in body.fields):
                    fail(f"/boids: fields {list(body.fields)}")
                stamp = body.timestamp.seconds * 1_000_000_000 + body.timestamp.nanos
                if stamp != message.log_time:
                    fail(f"/boids: stamped {stamp}, logged at {message.log_time}")
                if stride != 4 * len(names) or len(data) % stride:
                    fail(f"/boids: {len(data)} bytes in points of {stride} for {names}")
                points[message.log_time] = len(data) // stride
                for (x,) in struct.iter_unpack("<f", data):
                    if not math.isfinite(x):
                        fail("/boids: a value is not finite")
            elif topic == "/scene":
                ids = [e.id for e in body.entities]
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
