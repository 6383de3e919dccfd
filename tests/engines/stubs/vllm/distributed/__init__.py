# Stub package (scripts/engine-venv.sh): only the modules the publisher imports.
