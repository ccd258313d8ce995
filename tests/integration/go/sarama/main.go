// Sarama (Debian's golang-github-shopify-sarama-dev, 1.22.1) as test_go_clients.py drives it.  argv[1] is
// a JSON request; one JSON object a line is printed on stdout:
//
//	{"type":"record","p":0,"o":12,"k":b64|null,"v":b64|null,"h":[[name,b64]...]}
//	{"type":"claims","partitions":[0,1]}          (group mode, at each session's start)
//	{"type":"done","count":N}
//	{"type":"topics","topics":{"name":partitions,...}}   (mode "topics")
//
// Request: {"bootstrap", "topic", "version" (Kafka version Sarama speaks, e.g. "2.1.0"), "mode":
// "partitions" (one PartitionConsumer per partition from "offsets" or the oldest offset, up to the high
// watermark seen at start, or until "count" records in all when a count is given) | "group" (a consumer group member reading "count" records, marking each and
// committing on exit) | "produce" (a SyncProducer sending "records", [{"k","v","h"}] base64, key-hashed
// partitions, printing "done" once all are acknowledged) | "topics" (a Metadata request), "group", "count",
// "timeoutMs", "records"}.
//
// noida-db closes the connection on the OffsetCommit v1 that Sarama 1.22 sends when no offset retention is
// set (seen directly against the broker too, without ksi), so a retention is set and Sarama sends v2.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

type request struct {
	Bootstrap string           `json:"bootstrap"`
	Topic     string           `json:"topic"`
	Version   string           `json:"version"`
	Mode      string           `json:"mode"`
	Group     string           `json:"group"`
	Count     int              `json:"count"`
	TimeoutMs int              `json:"timeoutMs"`
	Offsets   map[string]int64 `json:"offsets"`
	Records   []struct {
		K *string    `json:"k"`
		V *string    `json:"v"`
		H [][]string `json:"h"`
	} `json:"records"`
}

var out = json.NewEncoder(os.Stdout)
var outLock sync.Mutex

func emit(line map[string]interface{}) {
	outLock.Lock()
	defer outLock.Unlock()
	if err := out.Encode(line); err != nil {
		panic(err)
	}
}

func b64(data []byte) interface{} {
	if data == nil {
		return nil
	}
	return base64.StdEncoding.EncodeToString(data)
}

func recordLine(m *sarama.ConsumerMessage) map[string]interface{} {
	headers := [][]interface{}{}
	for _, h := range m.Headers {
		headers = append(headers, []interface{}{string(h.Key), b64(h.Value)})
	}
	return map[string]interface{}{"type": "record", "p": m.Partition, "o": m.Offset, "k": b64(m.Key),
		"v": b64(m.Value), "h": headers}
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
	config := sarama.NewConfig()
	version, err := sarama.ParseKafkaVersion(req.Version)
	if err != nil {
		fail("bad version: %v", err)
	}
	config.Version = version
	config.ClientID = "ksi-test-sarama"
	config.Consumer.Return.Errors = true
	config.Consumer.MaxWaitTime = 100 * time.Millisecond
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	config.Consumer.Group.Session.Timeout = 6 * time.Second
	config.Consumer.Group.Heartbeat.Interval = time.Second
	// Sarama 1.22 commits with OffsetCommit v1 (a timestamp per partition) unless a retention is set, then v2.
	config.Consumer.Offsets.Retention = 7 * 24 * time.Hour
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout == 0 {
		timeout = 40 * time.Second
	}
	switch req.Mode {
	case "partitions":
		partitions(req, config, timeout)
	case "group":
		group(req, config, timeout)
	case "produce":
		produce(req, config)
	case "topics":
		topics(req, config)
	default:
		fail("unknown mode %q", req.Mode)
	}
}

func partitions(req request, config *sarama.Config, timeout time.Duration) {
	client, err := sarama.NewClient([]string{req.Bootstrap}, config)
	if err != nil {
		fail("client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		fail("consumer: %v", err)
	}
	defer consumer.Close()
	ids, err := client.Partitions(req.Topic)
	if err != nil {
		fail("partitions: %v", err)
	}
	var wg sync.WaitGroup
	count := 0
	var countLock sync.Mutex
	deadline := time.After(timeout)
	done := make(chan struct{})
	reached := make(chan struct{})
	for _, p := range ids {
		end, err := client.GetOffset(req.Topic, p, sarama.OffsetNewest)
		if err != nil {
			fail("high watermark of partition %d: %v", p, err)
		}
		start := sarama.OffsetOldest
		if o, ok := req.Offsets[strconv.Itoa(int(p))]; ok {
			start = o
		}
		pc, err := consumer.ConsumePartition(req.Topic, p, start)
		if err != nil {
			fail("consume partition %d: %v", p, err)
		}
		wg.Add(1)
		go func(p int32, pc sarama.PartitionConsumer, end int64) {
			defer wg.Done()
			defer pc.Close()
			for {
				select {
				case m := <-pc.Messages():
					emit(recordLine(m))
					countLock.Lock()
					count++
					enough := req.Count > 0 && count == req.Count
					countLock.Unlock()
					if enough {
						close(reached)
					}
					if req.Count == 0 && m.Offset+1 >= end {
						return
					}
				case err := <-pc.Errors():
					fail("partition %d: %v", p, err)
				case <-done:
					return
				}
			}
		}(p, pc, end)
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-reached:
		close(done)
		<-finished
	case <-deadline:
		close(done)
		<-finished
	}
	emit(map[string]interface{}{"type": "done", "count": count})
}

type handler struct {
	wanted int
	mu     sync.Mutex
	seen   int
	cancel context.CancelFunc
}

func (h *handler) Setup(s sarama.ConsumerGroupSession) error {
	claimed := []int32{}
	for _, ps := range s.Claims() {
		claimed = append(claimed, ps...)
	}
	sort.Slice(claimed, func(i, j int) bool { return claimed[i] < claimed[j] })
	emit(map[string]interface{}{"type": "claims", "partitions": claimed})
	return nil
}

func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		h.mu.Lock()
		if h.seen >= h.wanted {
			h.mu.Unlock()
			h.cancel()
			return nil
		}
		h.seen++
		emit(recordLine(m))
		s.MarkMessage(m, "")
		reached := h.seen >= h.wanted
		h.mu.Unlock()
		if reached {
			h.cancel()
			return nil
		}
	}
	return nil
}

func group(req request, config *sarama.Config, timeout time.Duration) {
	g, err := sarama.NewConsumerGroup([]string{req.Bootstrap}, req.Group, config)
	if err != nil {
		fail("consumer group: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		for err := range g.Errors() {
			fmt.Fprintf(os.Stderr, "group error: %v\n", err)
		}
	}()
	h := &handler{wanted: req.Count, cancel: cancel}
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{req.Topic}, h); err != nil {
			fail("consume: %v", err)
		}
	}
	// Close commits the marked offsets (the offset manager flushes them) and leaves the group.
	if err := g.Close(); err != nil {
		fail("close: %v", err)
	}
	emit(map[string]interface{}{"type": "done", "count": h.seen})
}

func unb64(text *string) []byte {
	if text == nil {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(*text)
	if err != nil {
		fail("bad base64: %v", err)
	}
	return data
}

func produce(req request, config *sarama.Config) {
	config.Producer.Return.Successes = true
	config.Producer.RequiredAcks = sarama.WaitForAll
	producer, err := sarama.NewSyncProducer([]string{req.Bootstrap}, config)
	if err != nil {
		fail("producer: %v", err)
	}
	messages := []*sarama.ProducerMessage{}
	for _, r := range req.Records {
		m := &sarama.ProducerMessage{Topic: req.Topic, Value: sarama.ByteEncoder(unb64(r.V))}
		if r.K != nil {
			m.Key = sarama.ByteEncoder(unb64(r.K))
		}
		for _, h := range r.H {
			value := h[1]
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h[0]), Value: unb64(&value)})
		}
		messages = append(messages, m)
	}
	if err := producer.SendMessages(messages); err != nil {
		fail("send: %v", err)
	}
	if err := producer.Close(); err != nil {
		fail("close: %v", err)
	}
	emit(map[string]interface{}{"type": "done", "count": len(messages)})
}

func topics(req request, config *sarama.Config) {
	client, err := sarama.NewClient([]string{req.Bootstrap}, config)
	if err != nil {
		fail("client: %v", err)
	}
	defer client.Close()
	names, err := client.Topics()
	if err != nil {
		fail("topics: %v", err)
	}
	counts := map[string]int{}
	for _, name := range names {
		ids, err := client.Partitions(name)
		if err != nil {
			fail("partitions of %s: %v", name, err)
		}
		counts[name] = len(ids)
	}
	emit(map[string]interface{}{"type": "topics", "topics": counts})
}
