"""The decoding core: configuration (``config``), state (``state``), proposals and the one decode loop (``loop``).

Import from the submodules (``dlm_decode.core.loop.generate``) or from the top-level package.
"""
