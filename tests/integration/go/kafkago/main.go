// segmentio kafka-go 0.2.1 (Debian's golang-github-segmentio-kafka-go-dev): a client that speaks only
// Fetch v2 and ListOffsets v1 and reads only message formats 0 and 1.  Reads one partition of a topic
// through a leader connection from offset "from" up to (not including) "to", printing
//
//	{"type":"record","p":0,"o":12,"ts":ms,"k":b64|null,"v":b64|null}
//	{"type":"done","count":N,"first":F}      F: ReadFirstOffset (ListOffsets v1, EARLIEST)
//
// argv[1]: {"bootstrap", "topic", "partition", "from", "to", "timeoutMs"}.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"time"

	kafka "github.com/segmentio/kafka-go"
)

type request struct {
	Bootstrap string `json:"bootstrap"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	TimeoutMs int    `json:"timeoutMs"`
}

func b64(data []byte) interface{} {
	if data == nil {
		return nil
	}
	return base64.StdEncoding.EncodeToString(data)
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	var req request
	if err := json.Unmarshal([]byte(os.Args[1]), &req); err != nil {
		fail("bad request: %v", err)
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", req.Bootstrap, req.Topic, req.Partition)
	if err != nil {
		fail("dial leader: %v", err)
	}
	defer conn.Close()
	first, err := conn.ReadFirstOffset()
	if err != nil {
		fail("first offset: %v", err)
	}
	if _, err := conn.Seek(req.From, kafka.SeekAbsolute); err != nil {
		fail("seek: %v", err)
	}
	out := json.NewEncoder(os.Stdout)
	count := 0
	next := req.From
	deadline := time.Now().Add(timeout)
	for next < req.To {
		if time.Now().After(deadline) {
			fail("timed out at offset %d", next)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		batch := conn.ReadBatch(1, 1<<20)
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			if m.Offset >= req.To {
				continue
			}
			out.Encode(map[string]interface{}{"type": "record", "p": m.Partition, "o": m.Offset,
				"ts": m.Time.UnixNano() / int64(time.Millisecond), "k": b64(m.Key), "v": b64(m.Value)})
			count++
			next = m.Offset + 1
		}
		if err := batch.Close(); err != nil {
			fail("fetch at offset %d: %v", next, err)
		}
	}
	out.Encode(map[string]interface{}{"type": "done", "count": count, "first": first})
}
