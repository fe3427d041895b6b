"""Tools around the router: ``spec-router demo`` (``demo``), ``spec-router replay`` (``replay``,
over ``traffic`` and scored by ``goodput``), and the processes they start (``processes``,
``llamacpp``)."""
