package tenant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// RoleName is the role name of a tenant generation.
var RoleName = tenantRoleName

// SCRAMIterations is the iteration count of the verifiers Provision stores.
const SCRAMIterations = scramIterations

// SCRAMVerifier is scramVerifier with the salt in base64.
func SCRAMVerifier(password, salt string, iterations int) (string, error) {
	b, err := base64.StdEncoding.DecodeString(salt)
	if err != nil {
		return "", err
	}
	return scramVerifier(password, b, iterations)
}

// VerifySCRAMExchange checks a SCRAM-SHA-256 exchange against a verifier as
// the server does: the client proof must recover a ClientKey whose hash is
// StoredKey, and ServerKey must sign authMessage into serverSignature.
func VerifySCRAMExchange(verifier, authMessage, clientProof, serverSignature string) error {
	parts := strings.Split(verifier, "$")
	if len(parts) != 3 || parts[0] != "SCRAM-SHA-256" {
		return fmt.Errorf("verifier %q is not SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>", verifier)
	}
	stored64, server64, ok := strings.Cut(parts[2], ":")
	if !ok {
		return fmt.Errorf("verifier %q: no StoredKey:ServerKey", verifier)
	}
	dec := base64.StdEncoding.DecodeString
	storedKey, err1 := dec(stored64)
	serverKey, err2 := dec(server64)
	proof, err3 := dec(clientProof)
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	sig := mac(storedKey, authMessage)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ sig[i%len(sig)]
	}
	if sum := sha256.Sum256(clientKey); !hmac.Equal(sum[:], storedKey) {
		return errors.New("the client proof does not match StoredKey")
	}
	if got := base64.StdEncoding.EncodeToString(mac(serverKey, authMessage)); got != serverSignature {
		return fmt.Errorf("server signature %s, want %s", got, serverSignature)
	}
	return nil
}
