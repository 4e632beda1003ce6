"""deploy/ and the server's Dockerfile, checked against the real server.

The image cannot be built here (no Docker daemon): its CMD and HEALTHCHECK run as the
container would run them, with this checkout's `fusee`. The systemd unit's command line
is parsed by `fusee server`'s own options; the alert rules and the dashboard name only
series a running server serves; the chart's templates name only values it declares.
The tools made for these files (helm, promtool, terraform, systemd-analyze) run in
scripts/check-deploy, and in the slow tests when scripts/check-deploy has built them."""
