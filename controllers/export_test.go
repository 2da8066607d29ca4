package controllers

import "sigs.k8s.io/controller-runtime/pkg/client"

// SecretReader is secretReader, for the tests outside the package.
type SecretReader = secretReader

func NewSecretReader(meta, api client.Reader) *SecretReader { return newSecretReader(meta, api) }
