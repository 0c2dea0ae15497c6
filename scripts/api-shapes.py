#!/usr/bin/env python3
"""Writes the key sets of Firecracker's API file (its definitions' properties, which are
required, and which definition each GET path answers with) as JSON, for the test that
compares Ember's GET answers with them (api_net.rs). Only names, no descriptions.

    scripts/api-shapes.py [API_FILE] > src/ember/tests/data/firecracker-api-shapes.json
"""
import json
import sys

import yaml

path = sys.argv[1] if len(sys.argv) > 1 else "../shared/reference/firecracker-api.yaml"
api = yaml.safe_load(open(path))


def ref(schema):
    """The definition a property refers to, directly or as its array's items."""
    target = schema.get("$ref") or (schema.get("items") or {}).get("$ref")
    return target.rsplit("/", 1)[-1] if target else None


definitions = {}
for name, schema in sorted(api["definitions"].items()):
    properties = schema.get("properties", {})
    definitions[name] = {
        "properties": {key: ref(value) for key, value in sorted(properties.items())},
        "required": sorted(schema.get("required", [])),
    }
gets = {}
for route, methods in sorted(api["paths"].items()):
    answer = methods.get("get", {}).get("responses", {}).get(200, {})
    if "schema" in answer and ref(answer["schema"]):
        gets[route] = ref(answer["schema"])
shapes = {
    "source": "Firecracker's API file, " + api["info"]["version"],
    "gets": gets,
    "definitions": definitions,
}
print(json.dumps(shapes, indent=1, sort_keys=True))
