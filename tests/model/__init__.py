"""The model-based test of the engine's guarantees (test_model.py) and the defects it found
(test_found.py). workflows.py is the plan interpreter the runs execute, harness.py makes
the API calls and records what each answer promised, journal.py reads what a journal says
a run waits on, checks.py holds the engine to the guarantees after every step, known.py
lists the open defects the model steps around."""
