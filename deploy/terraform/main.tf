# One `fusee server` on a persistent volume, installed from the chart in ../helm/fusee.
# The token is made here (random_password) and kept in Terraform's state and in a
# Secret the chart is pointed at (existingSecret), so that the chart generates none and
# a re-apply never changes it: the state holds a secret, so keep it somewhere private.

provider "kubernetes" {
  config_path    = pathexpand(var.kubeconfig_path)
  config_context = var.kube_context
}

provider "helm" {
  kubernetes = {
    config_path    = pathexpand(var.kubeconfig_path)
    config_context = var.kube_context
  }
}

locals {
  secret_name = "${var.release_name}-token"
}

# At least 16 bytes, the server's minimum; letters and digits, so that it passes through
# a shell, an Authorization header and a URL untouched.
resource "random_password" "token" {
  length  = 64
  special = false
}

resource "kubernetes_namespace_v1" "fusee" {
  count = var.create_namespace ? 1 : 0

  metadata {
    name = var.namespace
  }
}

resource "kubernetes_secret_v1" "token" {
  metadata {
    name      = local.secret_name
    namespace = var.create_namespace ? kubernetes_namespace_v1.fusee[0].metadata[0].name : var.namespace
  }

  data = {
    token = random_password.token.result
  }
}

resource "helm_release" "fusee" {
  name      = var.release_name
  namespace = kubernetes_secret_v1.token.metadata[0].namespace
  chart     = "${path.module}/../helm/fusee"

  # Ready means the server answers /healthz: its data directory open, its log taking writes.
  wait    = true
  timeout = 600

  set = [
    { name = "existingSecret", value = kubernetes_secret_v1.token.metadata[0].name },
    { name = "existingSecretKey", value = "token" },
    { name = "image.repository", value = var.image_repository },
    { name = "image.tag", value = var.image_tag },
    { name = "shards", value = tostring(var.shards) },
    { name = "persistence.size", value = var.storage_size },
    { name = "persistence.storageClassName", value = var.storage_class },
  ]
}
