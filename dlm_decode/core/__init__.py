"""The floor of the decoding package: configuration and the length rule (``config``), state (``state``), token
proposals (``proposals``), prompt encoding and checks (``inputs``), slot-mask helpers (``masks``), checkpoint files
(``files``). Nothing here imports ``samplers``, ``cache`` or the loop (``dlm_decode.decode``), which stand on it.
"""
