variable "kubeconfig_path" {
  description = "The kubeconfig that reaches the cluster."
  type        = string
  default     = "~/.kube/config"
}

variable "kube_context" {
  description = "Its context to use (null: the current one)."
  type        = string
  default     = null
}

variable "namespace" {
  description = "The namespace the server runs in."
  type        = string
  default     = "fusee"
}

variable "create_namespace" {
  description = "Create the namespace with the release."
  type        = bool
  default     = true
}

variable "release_name" {
  description = "The Helm release's name; the Services are named after it."
  type        = string
  default     = "fusee"
}

variable "image_repository" {
  description = "Where the cluster pulls the image the repository's Dockerfile builds."
  type        = string
  default     = "fusee-server"
}

variable "image_tag" {
  description = "The image's tag (empty: the chart's appVersion)."
  type        = string
  default     = ""
}

variable "shards" {
  description = "Shards of a new data directory; an existing directory keeps its count."
  type        = number
  default     = 4

  validation {
    condition     = var.shards >= 1 && var.shards <= 256
    error_message = "A data directory has from 1 to 256 shards."
  }
}

variable "storage_size" {
  description = "The data volume's size."
  type        = string
  default     = "10Gi"
}

variable "storage_class" {
  description = "The data volume's StorageClass (empty: the cluster's default); its disks must honour flushes."
  type        = string
  default     = ""
}
