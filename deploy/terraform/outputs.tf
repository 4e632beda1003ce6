locals {
  # The Service the chart names after the release (its fullname rule: the release's name
  # alone when it holds the chart's name).
  service = strcontains(var.release_name, "fusee") ? var.release_name : "${var.release_name}-fusee"
  host    = "${local.service}.${helm_release.fusee.namespace}.svc"
}

output "server_address" {
  description = "Workers and clients connect here (add ?token-file=PATH with the token's file)."
  value       = "${local.host}:7600"
}

output "http_url" {
  description = "The HTTP API, the web UI and /metrics (Authorization: Bearer with the token)."
  value       = "http://${local.host}:7601"
}

output "token_secret" {
  description = "The Secret (key `token`) to mount into workers, clients and the scraper."
  value       = "${helm_release.fusee.namespace}/${kubernetes_secret_v1.token.metadata[0].name}"
}

output "token" {
  description = "The token itself (terraform output -raw token)."
  value       = random_password.token.result
  sensitive   = true
}
