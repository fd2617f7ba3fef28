"""The brokers the provider-compatible triggers' tests run on: the Kafka and SQS suites' own.

Both session fixtures come from those suites' conftests (a Tansu broker, a
moto SQS server); without aiokafka, aiobotocore or the servers, the tests skip.
"""

from tests.kafka.conftest import kafka_bootstrap
from tests.sqs.conftest import sqs_endpoint

__all__ = ["kafka_bootstrap", "sqs_endpoint"]
