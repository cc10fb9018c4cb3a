// Command driverclient dials a Secrets Store CSI provider the way the driver does and
// replays request fixtures (JSON: see crates/csi-grpc/tests/fixtures/driver/) over one
// connection. Built and run by oci_csi_testkit::DriverClient.
//
// It uses the real grpc-go library (Debian's golang-google-grpc-dev, built with
// GO111MODULE=off GOPATH=/usr/share/gocode), so the HTTP/2 and HPACK bytes on the socket
// are the ones a driver sends: the socket path as :authority for drivers v1.0 to v1.5.x
// (grpc.Dial(socketPath, WithContextDialer(unix))), "localhost" for v1.6.0
// (WithAuthority("localhost")). Messages are encoded with protowire, field by field as in
// provider/v1alpha1/service.proto, so no generated code is needed.
//
// "sync-controller" dials as the secrets-store-sync-controller v0.0.4 does
// (pkg/provider/provider_client.go): grpc.NewClient("unix://"+path) with its service config
// (waitForReady, 3 attempts on UNAVAILABLE) and a 4 MiB receive limit, then Mount calls
// with no deadline and no Version call at all. Debian's grpc-go 1.33 has neither NewClient
// nor the unix resolver, so the same wire is made with a unix dialer and
// WithAuthority("localhost") (what the unix resolver sets), and retries are switched on
// with GRPC_GO_RETRY=on (the default from grpc-go 1.40).
//
// It prints one JSON summary on stdout and exits 1 if any call failed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

type objectVersion struct {
	ID      string `json:"id"`
	Version string `json:"version"`
}

type request struct {
	Name                 string            `json:"name"`
	Attributes           map[string]string `json:"attributes"`
	Secrets              map[string]string `json:"secrets"`
	TargetPath           string            `json:"target_path"`
	Permission           string            `json:"permission"`
	CurrentObjectVersion []objectVersion   `json:"current_object_version"`
}

type fixture struct {
	Driver   string    `json:"driver"`
	Dial     string    `json:"dial"`
	Requests []request `json:"requests"`
}

type file struct {
	Path     string `json:"path"`
	Mode     int32  `json:"mode"`
	Size     int    `json:"size"`
	Checksum uint32 `json:"checksum"`
}

type mountResult struct {
	Request        string          `json:"request"`
	Files          []file          `json:"files"`
	ObjectVersions []objectVersion `json:"object_versions"`
}

type summary struct {
	Driver       string            `json:"driver"`
	DeadlineSent bool              `json:"deadline_sent"`
	Dial         string            `json:"dial"`
	Authority    string            `json:"authority"`
	Version      map[string]string `json:"version"`
	Mounts       int               `json:"mounts"`
	Failures     []string          `json:"failures"`
	Results      []mountResult     `json:"results"`
	P50Micros    int64             `json:"p50_us"`
	P99Micros    int64             `json:"p99_us"`
}

// syncControllerServiceConfig is the controller's ServiceConfig (provider_client.go).
const syncControllerServiceConfig = `{
	"methodConfig": [
		{
			"name": [{"service": "v1alpha1.CSIDriverProvider"}],
			"waitForReady": true,
			"retryPolicy": {
				"MaxAttempts": 3,
				"InitialBackoff": "1s",
				"MaxBackoff": "10s",
				"BackoffMultiplier": 1.1,
				"RetryableStatusCodes": [ "UNAVAILABLE" ]
			}
		}
	]
}`

// rawCodec passes already-encoded protobuf bytes through grpc-go unchanged.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b // proto3 leaves empty strings out, as generated code does
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func encodeMount(r request) ([]byte, error) {
	attributes, err := json.Marshal(r.Attributes)
	if err != nil {
		return nil, err
	}
	// The driver marshals the NodePublish secret map as it is: a nil map is "null".
	secrets, err := json.Marshal(r.Secrets)
	if err != nil {
		return nil, err
	}
	var b []byte
	b = appendString(b, 1, string(attributes))
	b = appendString(b, 2, string(secrets))
	b = appendString(b, 3, r.TargetPath)
	b = appendString(b, 4, r.Permission)
	for _, v := range r.CurrentObjectVersion {
		var m []byte
		m = appendString(m, 1, v.ID)
		m = appendString(m, 2, v.Version)
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b, nil
}

// fields calls f for every field of a message; it fails on malformed input.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, value []byte, varint uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := f(num, typ, v, 0); err != nil {
				return err
			}
			b = b[n:]
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if err := f(num, typ, nil, v); err != nil {
				return err
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

// checksum is FNV-1a, enough to tell the bytes arrived whole and in order.
func checksum(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

func decodeMount(b []byte, name string) (mountResult, error) {
	out := mountResult{Request: name}
	err := fields(b, func(num protowire.Number, typ protowire.Type, value []byte, _ uint64) error {
		switch num {
		case 1:
			var v objectVersion
			err := fields(value, func(num protowire.Number, _ protowire.Type, value []byte, _ uint64) error {
				if num == 1 {
					v.ID = string(value)
				} else if num == 2 {
					v.Version = string(value)
				}
				return nil
			})
			out.ObjectVersions = append(out.ObjectVersions, v)
			return err
		case 2:
			return fmt.Errorf("the provider set MountResponse.error: %q", value)
		case 3:
			var f file
			err := fields(value, func(num protowire.Number, _ protowire.Type, value []byte, varint uint64) error {
				switch num {
				case 1:
					f.Path = string(value)
				case 2:
					f.Mode = int32(varint)
				case 3:
					f.Size = len(value)
					f.Checksum = checksum(value)
				}
				return nil
			})
			out.Files = append(out.Files, f)
			return err
		}
		return nil
	})
	return out, err
}

func decodeVersion(b []byte) (map[string]string, error) {
	out := map[string]string{}
	names := map[protowire.Number]string{1: "version", 2: "runtime_name", 3: "runtime_version"}
	err := fields(b, func(num protowire.Number, _ protowire.Type, value []byte, _ uint64) error {
		if name, ok := names[num]; ok {
			out[name] = string(value)
		}
		return nil
	})
	return out, err
}

func percentile(sorted []time.Duration, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i].Microseconds()
}

func main() {
	socket := flag.String("socket", "", "the provider's Unix socket")
	fixturePath := flag.String("fixture", "", "a request fixture (JSON)")
	dialOverride := flag.String("dial", "", "socket-path (drivers v1.0 to v1.5.x) or localhost (v1.6.0); default: the fixture's")
	repeat := flag.Int("repeat", 1, "how many times each request is sent, on the same connection")
	keep := flag.Int("keep", 1000, "results kept in the summary")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of each call (sent as grpc-timeout; the sync controller sends none)")
	watchdog := flag.Duration("watchdog", 60*time.Second, "exit 3 if the whole run takes longer (calls without a deadline could wait forever)")
	flag.Parse()
	time.AfterFunc(*watchdog, func() {
		fmt.Fprintln(os.Stderr, "watchdog: no answer within", *watchdog)
		os.Exit(3)
	})

	raw, err := ioutil.ReadFile(*fixturePath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var fx fixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		fmt.Fprintln(os.Stderr, "fixture:", err)
		os.Exit(2)
	}
	dial := fx.Dial
	if *dialOverride != "" {
		dial = *dialOverride
	}

	// What the driver's PluginClientBuilder passes to grpc.Dial.
	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithContextDialer(func(ctx context.Context, target string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", target)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4 * 1024 * 1024)),
	}
	authority := *socket
	deadline := true
	switch dial {
	case "socket-path":
	case "localhost":
		opts = append(opts, grpc.WithAuthority("localhost"))
		authority = "localhost"
	case "sync-controller":
		opts = append(opts, grpc.WithAuthority("localhost"), grpc.WithDefaultServiceConfig(syncControllerServiceConfig))
		authority = "localhost"
		deadline = false
	default:
		fmt.Fprintf(os.Stderr, "unknown dial mode %q\n", dial)
		os.Exit(2)
	}
	conn, err := grpc.Dial(*socket, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(2)
	}
	defer conn.Close()

	s := summary{Driver: fx.Driver, Dial: dial, Authority: authority, DeadlineSent: deadline, Failures: []string{}}
	call := func(method string, in []byte) ([]byte, error) {
		ctx := context.Background()
		if deadline {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, *timeout)
			defer cancel()
		}
		var out []byte
		err := conn.Invoke(ctx, "/v1alpha1.CSIDriverProvider/"+method, &in, &out, grpc.ForceCodec(rawCodec{}))
		return out, err
	}

	// The sync controller never calls Version (v0.0.4 defines HealthCheck but never starts it).
	if dial != "sync-controller" {
		versionRequest := appendString(nil, 1, "v1alpha1")
		if out, err := call("Version", versionRequest); err != nil {
			s.Failures = append(s.Failures, "Version: "+err.Error())
		} else if s.Version, err = decodeVersion(out); err != nil {
			s.Failures = append(s.Failures, "Version: "+err.Error())
		}
	}

	var durations []time.Duration
	for i := 0; i < *repeat; i++ {
		for _, r := range fx.Requests {
			in, err := encodeMount(r)
			if err != nil {
				s.Failures = append(s.Failures, r.Name+": "+err.Error())
				continue
			}
			started := time.Now()
			out, err := call("Mount", in)
			durations = append(durations, time.Since(started))
			s.Mounts++
			if err != nil {
				s.Failures = append(s.Failures, r.Name+": "+err.Error())
				continue
			}
			result, err := decodeMount(out, r.Name)
			if err != nil {
				s.Failures = append(s.Failures, r.Name+": "+err.Error())
				continue
			}
			if len(s.Results) < *keep {
				s.Results = append(s.Results, result)
			}
		}
	}
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	s.P50Micros = percentile(durations, 0.50)
	s.P99Micros = percentile(durations, 0.99)

	encoder := json.NewEncoder(os.Stdout)
	if err := encoder.Encode(s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if len(s.Failures) > 0 {
		fmt.Fprintln(os.Stderr, "failures:", strings.Join(s.Failures, "; "))
		os.Exit(1)
	}
}
