"""Training recipes of dlm_decode: ``python -m recipes.<recipe>.<script>`` from the repository root."""
