#!/bin/sh
# Mosquitto in docker-compose.yml, as the image's unprivileged user: the password file is written from the
# environment and hashed in place (`mosquitto_passwd -U`), so no password reaches a command line, and the
# healthcheck's mosquitto_sub reads its login from its options file ($XDG_CONFIG_HOME/mosquitto_sub).
set -eu
umask 077
printf 'device:%s\nstream-connector:%s\n' "$MQTT_DEVICE_PASSWORD" "$MQTT_STREAM_CONNECTOR_PASSWORD" > /tmp/passwd
mosquitto_passwd -U /tmp/passwd
printf -- '-u device\n-P %s\n' "$MQTT_DEVICE_PASSWORD" > "$XDG_CONFIG_HOME/mosquitto_sub"
unset MQTT_DEVICE_PASSWORD MQTT_STREAM_CONNECTOR_PASSWORD
exec mosquitto -c /mosquitto/config/mosquitto.conf
