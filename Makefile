# Everything goes through scripts/dev; see its header for the environment it reads.
.PHONY: run test lint docs

run:
	bash scripts/dev run

test:
	bash scripts/dev test $(ARGS)

lint:
	bash scripts/dev lint

docs:
	bash scripts/dev docs
