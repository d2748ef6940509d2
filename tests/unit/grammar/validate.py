#!/usr/bin/env python3
"""Checks grammar samples against their JSON Schema: every line of SAMPLES must parse as JSON and
validate against the "schema" of SCHEMA_FILE (a test corpus file). Prints each failure; exits 1 if
any. Usage: validate.py SCHEMA_FILE SAMPLES"""
import json
import sys

import jsonschema


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        schema = json.load(f)["schema"]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)
    bad = 0
    with open(sys.argv[2], encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.rstrip("\n")
            try:
                instance = json.loads(line)
            except ValueError as e:
                print(f"sample {i}: not JSON ({e}): {line!r}")
                bad += 1
                continue
            error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
            if error is not None:
                print(f"sample {i}: invalid ({error.message}): {line!r}")
                bad += 1
    print(f"{sys.argv[1]}: {bad} invalid samples")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
