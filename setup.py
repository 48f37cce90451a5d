"""The native core (``otel_training._native``, from ``native/``), built by setuptools with the package.

Why a setup.py beside pyproject.toml: setuptools reads C extensions from here. The extension is optional:
where it cannot be built (no C compiler, an unusual platform), the install still succeeds and the package
runs on its pure-Python fallback, saying so once in the log (``otel_training/_native_loader.py``).
``OTEL_TRAINING_BUILD_NATIVE=0`` skips the build altogether.
"""

import os

from setuptools import Extension, setup

native = [] if os.environ.get("OTEL_TRAINING_BUILD_NATIVE", "1") == "0" else [
    Extension(
        "otel_training._native",
        sources=["native/ring.c", "native/records.c", "native/device.c", "native/span.c", "native/gate.c", "native/context.c", "native/attributes.c", "native/steps.c", "native/step_span.c", "native/slots.c", "native/helpers.c",
                 "native/module.c"],
        depends=["native/ring.h", "native/records.h", "native/device.h", "native/binding.h"],
        libraries=["dl"],
        # hidden: calls between the core's own files go straight to the function, not through the PLT (only
        # PyInit__native is exported, by PyMODINIT_FUNC)
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-fno-strict-aliasing", "-fvisibility=hidden"],
        optional=True,
    ),
]

setup(ext_modules=native)
