"""``hookscope summary``: print a model's layer table (shapes, parameters, MACs)."""

from __future__ import annotations

import argparse

from hookscope.specs import checked_summary, load_model, parse_input_size


def run(args: argparse.Namespace) -> int:
    size = parse_input_size(args.input_size)
    model = load_model(args.model, weights=args.weights)
    fix = f"pass the input shape {args.model} expects with --input-size (batch first, e.g. 1,3,224,224)"
    print(checked_summary(model, args.model, fix, input_size=size), end="")
    return 0
