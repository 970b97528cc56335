"""Tensors and their contracts: signature checks, output conformance, classification, text inputs,
wire formats."""
