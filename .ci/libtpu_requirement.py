"""The ``libtpu`` requirement that the installed JAX names for its ``tpu`` extra (what
``pip install "jax[tpu]==<the installed jax>"`` would bring), for ``make test-accelerators``:
XLA's TPU compiler follows the installed JAX, never a pin of its own."""

import importlib.metadata

for requirement in importlib.metadata.requires("jax") or ():
    name, _, marker = requirement.partition(";")
    if name.strip().startswith("libtpu") and "tpu" in marker:
        print(name.strip())
        break
else:
    raise SystemExit("the installed jax names no libtpu for its tpu extra")
