package main

// pki writes what a test cluster's API server and its clients need, as kubeadm lays it out: a CA, the API
// server's serving certificate, the service-account signing key pair, and per user a client certificate and a
// kubeconfig that names the server by its URL.
//
//	tierlb-k8s pki --dir DIR --server https://ADDR:PORT [--user NAME[=GROUP[,GROUP...]]]...

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func pkiMain(args []string) int {
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory to write into (required)")
	server := fs.String("server", "", "the API server's URL, https://ADDR:PORT (required)")
	var users stringList
	fs.Var(&users, "user", "a client NAME[=GROUP,...] to write NAME.crt, NAME.key and NAME.kubeconfig for (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *dir == "" || *server == "" {
		fmt.Fprintln(os.Stderr, "pki: --dir and --server are required")
		return 2
	}
	if err := writePKI(*dir, *server, users); err != nil {
		fmt.Fprintln(os.Stderr, "pki:", err)
		return 1
	}
	return 0
}

// validity covers any test run; the clock of a test machine never jumps a year.
const validity = 365 * 24 * time.Hour

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, der, 0o600)
}

// sign issues a certificate for key's public half, signed by the CA.
func sign(ca *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, subject pkix.Name,
	usage []x509.ExtKeyUsage, ips []net.IP, dnsNames []string) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
}

func writePKI(dir, server string, users []string) error {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return fmt.Errorf("--server %q is not an https://ADDR:PORT URL", server)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := newKey()
	if err != nil {
		return err
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "tierlb-test-ca"}, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", ca.Raw); err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), caKey); err != nil {
		return err
	}

	// The serving certificate names the URL's address, loopback, and the names in-cluster clients use.
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(u.Hostname()); ip != nil {
		ips = append(ips, ip)
	}
	dnsNames := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
	if net.ParseIP(u.Hostname()) == nil {
		dnsNames = append(dnsNames, u.Hostname())
	}
	servingKey, err := newKey()
	if err != nil {
		return err
	}
	serving, err := sign(ca, caKey, servingKey.Public(), pkix.Name{CommonName: "kube-apiserver"},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, ips, dnsNames)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "apiserver.crt"), "CERTIFICATE", serving); err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "apiserver.key"), servingKey); err != nil {
		return err
	}

	// The service-account token signing pair (RSA, as kubeadm's sa.key).
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", saPub); err != nil {
		return err
	}

	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for _, spec := range users {
		name, groupList, _ := strings.Cut(spec, "=")
		var groups []string
		if groupList != "" {
			groups = strings.Split(groupList, ",")
		}
		key, err := newKey()
		if err != nil {
			return err
		}
		der, err := sign(ca, caKey, key.Public(), pkix.Name{CommonName: name, Organization: groups},
			[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
		if err != nil {
			return err
		}
		keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
		if err != nil {
			return err
		}
		// A file name without the characters a user name may carry (system:kube-controller-manager).
		file := strings.NewReplacer(":", "-", "/", "-").Replace(name)
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
		cfg.AuthInfos[file] = &clientcmdapi.AuthInfo{
			ClientCertificateData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			ClientKeyData:         keyPEM,
		}
		cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: file}
		cfg.CurrentContext = "test"
		if err := clientcmd.WriteToFile(*cfg, filepath.Join(dir, file+".kubeconfig")); err != nil {
			return err
		}
	}
	return nil
}
