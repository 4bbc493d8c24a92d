package kube

// Files the components read: the static token, the service-account key pair
// and the kubeconfig.

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

const (
	tokenFile        = "tokens.csv"
	saPrivateKeyFile = "sa.key"
	saPublicKeyFile  = "sa.pub"
	// saKeyBits: 2048 is what kubeadm generates and takes well under a second.
	saKeyBits = 2048
)

// randomToken returns a fresh admin token. It is random rather than constant
// even though the apiserver only listens on loopback, so that two clusters
// never accept each other's credentials.
func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("kube: generating token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeCredentials writes the apiserver's --token-auth-file (one admin in
// system:masters) and the key pair that signs (apiserver) and verifies
// (apiserver) service-account tokens; kube-controller-manager signs the
// legacy token secrets with the private key too.
func writeCredentials(dir, token string) error {
	// token,user,uid,"group1,group2"
	tokens := fmt.Sprintf("%s,%s,%s,%q\n", token, adminUser, adminUser, "system:masters")
	if err := os.WriteFile(filepath.Join(dir, tokenFile), []byte(tokens), 0o600); err != nil {
		return fmt.Errorf("kube: writing %s: %w", tokenFile, err)
	}
	key, err := rsa.GenerateKey(rand.Reader, saKeyBits)
	if err != nil {
		return fmt.Errorf("kube: generating service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("kube: encoding service-account public key: %w", err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	err = errors.Join(
		os.WriteFile(filepath.Join(dir, saPrivateKeyFile), privPEM, 0o600),
		os.WriteFile(filepath.Join(dir, saPublicKeyFile), pubPEM, 0o644),
	)
	if err != nil {
		return fmt.Errorf("kube: writing service-account keys: %w", err)
	}
	return nil
}

// kubeconfig is the subset of the kubeconfig format (clientcmd/api/v1) that
// writeKubeconfig fills. JSON is valid YAML, so kubectl and client-go read it.
type kubeconfig struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
}

type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server               string `json:"server"`
		CertificateAuthority string `json:"certificate-authority"`
	} `json:"cluster"`
}

type namedUser struct {
	Name string `json:"name"`
	User struct {
		Token string `json:"token"`
	} `json:"user"`
}

type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

// writeKubeconfig writes a kubeconfig with one context "kube" for the admin
// token.
func writeKubeconfig(path, server, caFile, token string) error {
	const name = "kube"
	var cl namedCluster
	cl.Name = name
	cl.Cluster.Server = server
	cl.Cluster.CertificateAuthority = caFile
	var u namedUser
	u.Name = adminUser
	u.User.Token = token
	var ctx namedContext
	ctx.Name = name
	ctx.Context.Cluster = name
	ctx.Context.User = adminUser
	kc := kubeconfig{
		APIVersion:     "v1",
		Kind:           "Config",
		Clusters:       []namedCluster{cl},
		Users:          []namedUser{u},
		Contexts:       []namedContext{ctx},
		CurrentContext: name,
	}
	b, err := json.MarshalIndent(kc, "", "  ")
	if err != nil {
		return fmt.Errorf("kube: encoding kubeconfig: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("kube: writing kubeconfig: %w", err)
	}
	return nil
}
