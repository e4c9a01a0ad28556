# Everything goes through scripts/dev; see its header for the environment it reads.
.PHONY: run test lint

run:
	bash scripts/dev run

test:
	bash scripts/dev test $(ARGS)

lint:
	bash scripts/dev lint
