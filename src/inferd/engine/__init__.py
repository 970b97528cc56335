"""`--workers N --engine`: one engine process owns the models; N front ends do what is per
connection (docs/workers.md). hop.py and slab.py carry tensors between them."""
